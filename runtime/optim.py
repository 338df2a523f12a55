"""Optimizers: hyper-parameters and state keyed by ParamId; the update itself is IR.

The update rule is lowered into the training graph by the `optimizer` pass, so a
compiled step runs forward, backward and update in one call. `opt.step(model, grads)`
runs the same lowered rule for hand-written loops.

State lives in `opt.state[param.id]` (a dict of slot name -> array), so a Param replaced
through `Param.map` (same id) keeps its moments and one made by `Param.from_array` (new
id) starts fresh, as in burn. `lr` is a float or a schedule (`optim.Cosine`, ...), read
at every step; `clip_norm > 0` scales the gradients so that their global L2 norm is at
most `clip_norm`, inside the compiled step (PyTorch's `clip_grad_norm_`).

Param groups are PyTorch's: `AdamW([{"params": decay, "weight_decay": 0.1},
{"params": no_decay, "weight_decay": 0.0}], lr=1e-3)`. `opt.param_groups` is a list of
dicts holding "params" and every setting of the optimizer (a group's own, else the
constructor's, `opt.defaults`); `opt.param_groups[0]["lr"] = 1e-4` takes effect at the
next update, without recompiling: each group's lr is an input of the lowered update, as
the one lr is. The other settings are compiled in, so changing one recompiles, as
`opt.weight_decay = ...` does; an optimizer-wide setting (`opt.lr`, `opt.momentum`, ...)
reads the defaults and sets the defaults and every group. Made without params (ember's
spelling, `SGD(lr=0.1)`), an optimizer has one group whose "params" is None: it trains
every param it is given gradients for.

Defaults follow PyTorch, since that is what users compare against: Adam eps 1e-8, AdamW
weight decay 1e-2, clipping by the norm of all gradients together. burn's differ: its
Adam/AdamW epsilon is 1e-5, and its `GradientClipping::Norm` clips each tensor by its own
norm.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import ClassVar

import numpy as np

from ..frontend.param import Param, ParamId
from ..ir import numpy_dtype
from .schedules import Constant, Cosine, LinearWarmup, Schedule, StepLR, as_schedule


def setting(name: str, value, positive: bool = False, below_one: bool = False) -> float:
    """`value` as a float, refused (ValueError) unless finite and >= 0 (> 0 where
    `positive`, < 1 where `below_one`): an inf or NaN setting would train on NaN silently."""
    v = float(value)
    if not (math.isfinite(v) and (v > 0 if positive else v >= 0) and (v < 1 or not below_one)):
        bounds = "> 0" if positive else ("in [0, 1)" if below_one else ">= 0")
        raise ValueError(f"{name} must be a finite number {bounds}, got {value!r}")
    return v


def _lr(value: float | Schedule) -> float | Schedule:
    """A learning rate as a group holds it: a schedule, or a float (a `Constant` becomes
    its float, so a group reads as PyTorch's does after a checkpoint too)."""
    if isinstance(value, Constant):
        value = value.lr
    return value if isinstance(value, Schedule) else setting("learning rate", value, True)


def lr_at(lr: float | Schedule, t: int) -> float:
    """The lr of update `t` (0-based) of a group holding `lr`."""
    return lr(t) if isinstance(lr, Schedule) else lr


def _betas(value) -> tuple[float, float]:
    betas = tuple(value)
    if len(betas) != 2:
        raise ValueError(f"betas must be a pair (beta1, beta2), got {value!r}")
    return tuple(setting(f"beta{i}", b, below_one=True) for i, b in enumerate(betas, 1))


def _describe(p: Param) -> str:
    return f"param {p.id} ({list(p.shape)} {p.dtype})"


class GroupEdits:
    """How many times, in any optimizer, a param group was added or had a setting that a
    compiled update bakes in written (all but the lr, which is fed at every step): a step's
    settings watch compares this one count instead of reading every group (as
    `Edits` counts a model's edits); global, so an unrelated edit costs one more look,
    never a stale one."""

    count = 0


class ParamGroupDict(dict):
    """One param group, in PyTorch's shape: "params" and every setting of the optimizer's
    kind. A dict, so a loop written for torch (`group["lr"] = 1e-4`) works, checked as it
    is written (`rules`, the optimizer's class): a setting the kind lacks, or one that is
    not finite, raises at that line instead of training on NaN, and counted in
    `GroupEdits`. "params" is a tuple and cannot be set: the groups would no longer be
    known to hold each param once."""

    def __init__(self, rules: type[Optimizer], settings: dict):
        super().__init__(params=settings["params"])
        self.rules = rules
        checked = {k: rules.setting_value(k, v) for k, v in settings.items() if k != "params"}
        rules.check_group(checked)
        super().update(checked)

    def __setitem__(self, key: str, value) -> None:
        if key == "params":
            raise ValueError("a param group's params cannot be replaced: make the optimizer "
                             "again, or add another group with opt.add_param_group")
        value = self.rules.setting_value(key, value)
        self.rules.check_group({**self, key: value})
        super().__setitem__(key, value)
        if key != "lr":
            GroupEdits.count += 1

    def update(self, *args, **kwargs) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __reduce__(self):  # copy and pickle through __init__, which checks and sets rules
        return type(self), (self.rules, dict(self))


_UNSET = object()  # an lr not given (PyTorch's spelling puts the params first)


def _params_and_lr(params, lr, default: float):
    """(PyTorch's first argument: params or param groups, or None; the lr). `SGD(0.1)`
    (ember's spelling, lr first) and `SGD(model.parameters(), lr=0.1)` (PyTorch's) both
    work."""
    if isinstance(params, (int, float, Schedule)):
        if lr is not _UNSET:
            raise TypeError("give the learning rate once: SGD(lr=0.1) or "
                            "SGD(model.parameters(), lr=0.1)")
        params, lr = None, params
    return params, default if lr is _UNSET else lr


def _group_specs(params) -> list[dict]:
    """PyTorch's first argument as group specs: None (one group of every param), params
    (one group), or dicts of "params" and settings of their own."""
    if params is None:
        return [{"params": None}]
    items = list(params)
    if items and all(isinstance(g, dict) for g in items):
        return items
    return [{"params": items}]


def _group_params(spec: dict) -> tuple[Param, ...] | None:
    """A group spec's params, each a Param and each once (None: every param)."""
    if "params" not in spec:
        raise ValueError(f"a param group needs its 'params', got the keys {sorted(spec)}")
    if spec["params"] is None:
        return None
    items = tuple(spec["params"])
    if not all(isinstance(p, Param) for p in items):
        raise TypeError("an optimizer's first argument is the learning rate or the params "
                        "(model.parameters()), got "
                        + ", ".join(sorted({type(p).__name__ for p in items})))
    seen = set()
    for p in items:
        if p.id in seen:
            raise ValueError(f"{_describe(p)} is twice in one param group")
        seen.add(p.id)
    return items


def _text(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _default(key: str) -> property:
    """An optimizer-wide setting: reads the default, sets the default and every group."""
    def get(self):
        return self.defaults[key]

    def put(self, value) -> None:
        self._set_everywhere(key, lambda _: value)

    return property(get, put, doc=f"The default {key}; setting it sets every group's.")


def _beta(i: int) -> property:
    """beta1 or beta2 (ember's names for PyTorch's `betas` pair), as `_default`."""
    def get(self) -> float:
        return self.defaults["betas"][i]

    def put(self, value: float) -> None:
        self._set_everywhere("betas", lambda b: tuple(value if k == i else x
                                                      for k, x in enumerate(b)))

    return property(get, put, doc=f"The default beta{i + 1}; setting it sets every group's.")


class Optimizer:
    """What SGD, Adam and AdamW share: defaults, param groups, clipping, state, step count,
    and their descriptions (config, pass spec, repr); each kind gives its settings
    (`SETTINGS`, `check_group`) and how the `optimizer` pass names them (`pass_options`)."""

    kind = ""
    # PyTorch's names of a group's settings -> what checks and converts a value of each
    SETTINGS: ClassVar[dict[str, Callable]] = {}
    weight_decay = _default("weight_decay")

    def __init__(self, params, defaults: dict, clip_norm: float = 0.0):
        self.defaults = {k: self.setting_value(k, v) for k, v in defaults.items()}
        self.check_group(self.defaults)
        self.clip_norm = setting("clip_norm (0: no clipping)", clip_norm)
        self.param_groups: list[ParamGroupDict] = []
        for spec in _group_specs(params):
            self.add_param_group(spec)
        self.state: dict[ParamId, dict[str, np.ndarray]] = {}
        self.step_count = 0  # updates applied so far: the schedules' position

    # -- settings ----------------------------------------------------------------------------

    @classmethod
    def setting_value(cls, key: str, value):
        """`value` checked and converted as group setting `key` of this kind holds it."""
        convert = cls.SETTINGS.get(key)
        if convert is None:
            if key == "clip_norm":
                raise ValueError("clip_norm clips the gradients of all params together: give "
                                 "it to the optimizer, not to a param group")
            raise ValueError(f"{cls.__name__} has no setting {key!r} (its settings: "
                             f"{', '.join(cls.SETTINGS)})")
        return convert(value)

    @classmethod
    def check_group(cls, settings: dict) -> None:
        """Refuse settings that are each valid but not together (a subclass's)."""

    @staticmethod
    def pass_options(settings: dict) -> dict:
        """The `optimizer` pass's options for a group's (or the defaults') settings."""
        return {"weight_decay": settings["weight_decay"]}

    def add_param_group(self, group: dict) -> None:
        """PyTorch's: another group, its settings its own where given, else the defaults.
        A param already in a group is refused (ValueError naming it): it would be updated
        twice."""
        spec = dict(group)
        params = _group_params(spec)
        if self.param_groups and (params is None or self.param_groups[0]["params"] is None):
            raise ValueError("a group of every param (params None, as when the optimizer is "
                             "made without params) cannot share the optimizer with another "
                             "group: give each group its params")
        self._check_disjoint(params or ())
        self.param_groups.append(ParamGroupDict(type(self), {**self.defaults, **spec,
                                                             "params": params}))
        GroupEdits.count += 1

    def _check_disjoint(self, params: tuple[Param, ...]) -> None:
        held = {p.id: k for k, g in enumerate(self.param_groups) for p in g["params"] or ()}
        for p in params:
            if p.id in held:
                raise ValueError(f"{_describe(p)} is in param groups {held[p.id]} and "
                                 f"{len(self.param_groups)}: a param may be in one group only")

    def _set_everywhere(self, key: str, edit: Callable) -> None:
        """An optimizer-wide setting: `key` of the defaults and of every group set to
        `edit(its value)`, all checked before any is written."""
        targets = [self.defaults, *self.param_groups]
        values = [self.setting_value(key, edit(t[key])) for t in targets]
        for t, v in zip(targets, values):
            self.check_group({**t, key: v})
        self.defaults[key] = values[0]
        for group, v in zip(self.param_groups, values[1:]):
            group[key] = v

    @property
    def lr(self) -> float:
        """The default lr of the next update (its schedule at `step_count`); each group's
        is `group_lrs()`. Setting it sets every group's."""
        return lr_at(self.defaults["lr"], self.step_count)

    @lr.setter
    def lr(self, value: float | Schedule) -> None:
        self._set_everywhere("lr", lambda _: value)

    @property
    def schedule(self) -> Schedule:
        """The default lr as a schedule."""
        return as_schedule(self.defaults["lr"])

    def group_lrs(self) -> list[float]:
        """Each group's lr of the next update: the lowered update's `lr` inputs (read on
        every step, hence a plain loop: ~3x faster than a comprehension calling `lr_at`)."""
        t, out = self.step_count, []
        for group in self.param_groups:
            lr = group["lr"]
            out.append(lr(t) if isinstance(lr, Schedule) else lr)
        return out

    @property
    def param_ids(self) -> frozenset[ParamId] | None:
        """The ids of the params the groups hold; None: every param."""
        if self.param_groups[0]["params"] is None:
            return None
        return frozenset(p.id for g in self.param_groups for p in g["params"])

    def group_ids(self) -> tuple[tuple[str, ...], ...] | None:
        """The ids (as the graph names them) of each group's params: the graph's
        `ember.param_groups`; None with one group, which takes every gradient."""
        if len(self.param_groups) == 1:
            return None
        return tuple(tuple(str(p.id) for p in g["params"]) for g in self.param_groups)

    # -- descriptions ------------------------------------------------------------------------

    def _clipping(self) -> dict:
        """clip_norm as an option where set (0, no clipping, is left out)."""
        return {"clip_norm": self.clip_norm} if self.clip_norm else {}

    def options(self) -> dict:
        """The defaults as the `optimizer` pass names them, and clip_norm where set."""
        return {**self.pass_options(self.defaults), **self._clipping()}

    def _own_settings(self) -> bool:
        """Whether a group's settings are not all the defaults (or there are several)."""
        return len(self.param_groups) > 1 or any(
            self.param_groups[0][k] != v for k, v in self.defaults.items())

    def config(self) -> dict:
        """What recreates this optimizer (without its state): kind, options, schedule, and
        each group's settings where they are not all the defaults (`param_groups`, in
        order; which params each holds is not config: the model's params are)."""
        options = self.options()
        if self._own_settings():
            options["param_groups"] = [{"schedule": as_schedule(g["lr"]).config(),
                                        **self.pass_options(g)} for g in self.param_groups]
        return {"kind": self.kind, "options": options, "schedule": self.schedule.config()}

    def pass_spec(self, clipping: bool = True) -> str:
        """This optimizer as a pipeline entry: `optimizer{kind=adam beta1=0.9 ...}`, the
        first group's settings, and where there are several groups `groups=`: each group's
        own, `;` between groups (passes/optimizer.py). Without `clipping`, clip_norm is
        left out (a sharded step clips before its update: runtime/zero.py)."""
        first, *rest = (self.pass_options(g) for g in self.param_groups)
        opts = {"kind": self.kind, **first, **(self._clipping() if clipping else {})}
        if rest:
            opts["groups"] = ";".join(",".join(f"{k}={_text(v)}" for k, v in o.items()
                                               if v != first[k]) for o in (first, *rest))
        return f"optimizer{{{' '.join(f'{k}={_text(v)}' for k, v in opts.items())}}}"

    def update_key(self) -> tuple:
        """What a lowered update bakes in: every setting but the lrs (fed at each step) and
        which params each group holds."""
        return self.pass_spec(), self.group_ids()

    def slot(self, pid: ParamId, name: str, like: Param) -> np.ndarray:
        """The state tensor `name` of a param, zeros of its shape and dtype on first use
        (read from the Param, not its value, which on a device would be copied to the
        host)."""
        slots = self.state.setdefault(pid, {})
        value = slots.get(name)
        if value is None:
            value = slots[name] = np.zeros(like.shape, numpy_dtype(like.dtype))
        if value.shape != like.shape:
            raise ValueError(f"optimizer state {name!r} of param {pid} has shape "
                             f"{list(value.shape)} but the param now has {list(like.shape)}; "
                             f"drop it with `del opt.state[param.id]` to start fresh")
        return value

    @staticmethod
    def group_edits() -> int:
        """`GroupEdits.count`, for the settings watch of a compiled step (runtime/update.py),
        which this module imports and so cannot import back."""
        return GroupEdits.count

    def step(self, model, grads) -> None:
        """Apply `grads` (em.GradientsParams) to `model`'s params in place."""
        from .update import apply_update

        apply_update(self, model, grads)

    def __repr__(self) -> str:
        lr = self.defaults["lr"]
        opts = ", ".join(f"{k}={v}" for k, v in {"lr": lr, **self.options()}.items())
        if self._own_settings():
            shown = [{"params": len(g["params"] or ()),
                      **{k: g[k] for k, v in self.defaults.items() if g[k] != v}}
                     for g in self.param_groups]
            opts += f", param_groups={shown}"
        return f"{type(self).__name__}({opts})"


class SGD(Optimizer):
    kind = "sgd"
    SETTINGS = {"lr": _lr, "momentum": partial(setting, "momentum"),
                "weight_decay": partial(setting, "weight_decay"), "nesterov": bool}
    momentum, nesterov = _default("momentum"), _default("nesterov")

    def __init__(self, params=None, lr: float | Schedule = _UNSET, momentum: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, clip_norm: float = 0.0):
        params, lr = _params_and_lr(params, lr, 1e-2)
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay,
                                  "nesterov": nesterov}, clip_norm)

    @classmethod
    def check_group(cls, settings: dict) -> None:
        if settings["nesterov"] and settings["momentum"] <= 0:
            raise ValueError("nesterov momentum needs momentum > 0")

    @staticmethod
    def pass_options(settings: dict) -> dict:
        return {"momentum": settings["momentum"], "nesterov": settings["nesterov"],
                "weight_decay": settings["weight_decay"]}


class Adam(Optimizer):
    kind = "adam"
    SETTINGS = {"lr": _lr, "betas": _betas, "eps": partial(setting, "eps"),
                "weight_decay": partial(setting, "weight_decay")}
    beta1, beta2, eps = _beta(0), _beta(1), _default("eps")

    def __init__(self, params=None, lr: float | Schedule = _UNSET,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, clip_norm: float = 0.0):
        params, lr = _params_and_lr(params, lr, 1e-3)
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay}, clip_norm)

    @staticmethod
    def pass_options(settings: dict) -> dict:
        beta1, beta2 = settings["betas"]
        return {"beta1": beta1, "beta2": beta2, "eps": settings["eps"],
                "weight_decay": settings["weight_decay"]}


class AdamW(Adam):
    kind = "adamw"

    def __init__(self, params=None, lr: float | Schedule = _UNSET,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, clip_norm: float = 0.0):
        super().__init__(params, lr, betas, eps, weight_decay, clip_norm)


OPTIMIZERS = {"sgd": SGD, "adam": Adam, "adamw": AdamW}


def _arguments(options: dict) -> dict:
    """Config options (the pass's names) as constructor or group arguments."""
    out = dict(options)
    if "beta1" in out:
        out["betas"] = (out.pop("beta1"), out.pop("beta2"))
    return out


def _restored_groups(groups: list | None, like: Optimizer | None) -> list[dict]:
    """The param groups of a config's optimizer: its settings (None: the defaults, one
    group) over the params of `like`'s groups, which must be as many. Without `like`,
    one group of every param."""
    params = [g["params"] for g in like.param_groups] if like is not None else [None]
    if groups is None:
        groups = [{}]
    elif like is None:
        raise ValueError("a config with param groups restores into an optimizer with those "
                         "groups: from_config(config, like=opt)")
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise TypeError("param_groups must be a list of objects")
    if len(groups) != len(params):
        raise ValueError(f"the config has {len(groups)} param group(s), the optimizer "
                         f"{len(params)}")
    out = []
    for own, held in zip(groups, params):
        own = _arguments(own)
        if "schedule" in own:
            own["lr"] = Schedule.from_config(own.pop("schedule"))
        out.append({**own, "params": held})
    return out


def from_config(config: dict, like: Optimizer | None = None) -> Optimizer:
    """The optimizer `opt.config()` describes (fresh state, step 0); with `like`, over its
    param groups' params (a checkpoint keeps settings, the model keeps its params)."""
    cls = OPTIMIZERS.get(config.get("kind"))
    if cls is None:
        raise ValueError(f"unknown optimizer kind {config.get('kind')!r}")
    opts = dict(config.get("options", {}))
    groups = _restored_groups(opts.pop("param_groups", None), like)
    return cls(groups, lr=Schedule.from_config(config["schedule"]), **_arguments(opts))


__all__ = ["SGD", "Adam", "AdamW", "Constant", "Cosine", "LinearWarmup", "Optimizer",
           "ParamGroupDict", "Schedule", "StepLR", "from_config"]
