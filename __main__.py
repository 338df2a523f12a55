"""The `ember` command: `ember train`, `ember bench`, `ember opt`."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys


def _count(least: int):
    """An argparse type: an integer >= `least` (argparse then reports a bad one in one line)."""
    def parse(text: str) -> int:
        value = int(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        return value
    parse.__name__ = "integer"  # argparse names the type in its message
    return parse


def _number(positive: bool = False):
    """An argparse type: a finite float >= 0 (> 0 where `positive`)."""
    def parse(text: str) -> float:
        from ember.runtime.optim import setting

        try:
            return setting("the value", text, positive)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix("the value ")) from None
    parse.__name__ = "number"
    return parse


def _optimizer(args: argparse.Namespace, steps_per_epoch: int):
    from ember.runtime import optim

    lr = args.lr if args.lr is not None else (0.05 if args.optimizer == "sgd" else 1e-3)
    total = max(1, args.epochs * steps_per_epoch // args.accumulate - args.warmup)
    schedule = {"constant": lambda: optim.Constant(lr),
                "step": lambda: optim.StepLR(lr, step_size=max(1, total // 3), gamma=0.1),
                "cosine": lambda: optim.Cosine(lr, total_steps=total)}[args.schedule]()
    if args.warmup:
        schedule = optim.LinearWarmup(schedule, warmup_steps=args.warmup)
    kwargs = {"weight_decay": args.weight_decay} if args.weight_decay is not None else {}
    if args.optimizer == "sgd":
        kwargs["momentum"] = args.momentum
    return optim.OPTIMIZERS[args.optimizer](lr=schedule, clip_norm=args.clip_norm, **kwargs)


def _longer_schedule(epochs: int, steps_per_epoch: int, accumulate: int = 1):
    """`fit`'s `on_resume`: a checkpoint whose lr schedule was made for a shorter run than
    `epochs` (its cosine ends, or its step schedule's thirds pass, before this run does)
    gets it recomputed over this run's steps, as `--epochs` from the start would have made
    it, and a note says so; the lr jumps to that schedule's at the resume step."""
    from dataclasses import replace

    from ember.runtime.schedules import Cosine, LinearWarmup, StepLR

    def extend(step, state) -> str | None:
        opt = step.optimizer
        schedule = opt.schedule
        warmup, inner = ((schedule.warmup_steps, schedule.after)
                         if isinstance(schedule, LinearWarmup) else (0, schedule))
        steps = epochs * steps_per_epoch // accumulate  # optimizer updates
        total = max(1, steps - warmup)
        if isinstance(inner, Cosine) and total > inner.total_steps:
            longer = replace(inner, total_steps=total)
            was = f"cosine lr schedule ends at step {warmup + inner.total_steps}"
            then = f", then anneals to {inner.min_lr:g} by step {steps}"
        elif isinstance(inner, StepLR) and max(1, total // 3) > inner.step_size:
            longer = replace(inner, step_size=max(1, total // 3))
            was = (f"step lr schedule (x{inner.gamma:g} every {inner.step_size} steps) was "
                   "made for a shorter run")
            then = f", then x{inner.gamma:g} every {longer.step_size} steps"
        else:
            return None
        before = opt.lr
        opt.lr = replace(schedule, after=longer) if warmup else longer
        return (f"the checkpoint's {was}; --epochs {epochs} recomputes it over this run's "
                f"{steps} steps, as a {epochs}-epoch run has it: lr {before:.4g} -> "
                f"{opt.lr:.4g} at step {opt.step_count}{then}")
    return extend


def _launch(args: argparse.Namespace) -> int:
    """`ember train --nproc N`: the same command as N ranks under torchrun, one machine;
    the cores are split between them (EMBER_NUM_THREADS, unless set)."""
    argv, i = [], 0
    while i < len(args.argv):  # the command line without --nproc
        a = args.argv[i]
        i += 2 if a == "--nproc" else 1
        if a != "--nproc" and not a.startswith("--nproc="):
            argv.append(a)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    env = {"OMP_NUM_THREADS": "1", **os.environ}
    env.setdefault("EMBER_NUM_THREADS", str(max(1, (cores or 1) // args.nproc)))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={args.nproc}", "-m", "ember", *argv]
    return _run_group(cmd, env)


def _run_group(cmd: list[str], env: dict) -> int:
    """Run `cmd` (torchrun) in a process group of its own, forwarding SIGINT, SIGTERM and
    SIGHUP to the whole group (torchrun and every rank: Ctrl-C, twice to abort, works as
    on one process), so that no signal to this process leaves ranks training as orphans;
    on Linux the group's leader also gets SIGTERM should this process die unannounced."""
    import signal

    def die_with_parent() -> None:
        if sys.platform.startswith("linux"):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=die_with_parent)
    got: list[int] = []

    def forward(signum, frame) -> None:
        got.append(signum)
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, forward) for sig in forwarded}
    try:
        code = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 + got[0] if got and code != 0 else code


def _train(args: argparse.Namespace) -> int:
    import ember as em
    from ember.frontend.trace import model_source
    from ember.runtime import data, models, train
    from ember.runtime.backend import BackendUnavailableError
    from ember.runtime.debug import ExecutionError
    from ember.runtime.distributed import DistributedError
    from ember.runtime.logging import MetricLogs
    from ember.runtime.plot import plot_run, require_matplotlib

    if args.nproc > 1 and "LOCAL_RANK" not in os.environ:
        return _launch(args)
    logs = None
    try:
        if args.plot:
            require_matplotlib()  # said now, not after the run has trained
        if args.profile and args.backend != "cpu":
            raise ValueError(f"--profile times the cpu backend's kernels, not {args.backend}'s")
        comm = em.distributed.init() if int(os.environ.get("WORLD_SIZE", 1)) > 1 else None
        if args.shard_optimizer and comm is None:
            raise ValueError("--shard-optimizer shards the optimizer state across ranks: add "
                             "--nproc N (or launch with torchrun)")
        lead = comm is None or comm.rank == 0
        say = print if lead else (lambda *a, **k: None)
        em.seed(args.seed)
        onnx_model = em.onnx.load(args.model) if args.model.endswith(".onnx") else None
        user_model = (models.load_model(args.model, (), 0)  # built once: its layers tell
                      if onnx_model is None and args.model not in models.BUILTIN else None)
        image = (len(onnx_model.input_dims[0] or ()) == 4 if onnx_model is not None
                 else not args.data and models.wants_image(args.model, user_model))
        dataset = (data.load_npz(args.data, args.seed) if args.data
                   else data.digits(args.seed, image=image))
        if onnx_model is not None:  # the data must fit the imported model's input: said
            model = onnx_model       # before compiling
            model.check_inputs(dataset.x_train.shape)
        elif user_model is not None:
            model = user_model
        else:
            model = models.load_model(args.model, dataset.input_shape, dataset.num_classes)
        global_batch = args.batch_size * (comm.world_size if comm is not None else 1)
        steps_per_epoch = len(dataset.x_train) // global_batch
        optimizer = _optimizer(args, steps_per_epoch)
        ranks = f" x {comm.world_size} ranks" if comm is not None else ""
        say(f"training {args.model} ({model.num_params():,} params) on "
            f"{args.data or 'digits'} with {optimizer}, {args.epochs} epochs, "
            f"batch {args.batch_size}{ranks}, {args.backend} backend"
            + (f", recompute {args.recompute}" if args.recompute != "none" else "")
            + (f", {args.accumulate} micro-batches per update" if args.accumulate > 1 else "")
            + (f", precision {args.precision}" if args.precision != "32" else ""))
        if lead:  # rank 0 writes the logs, as it writes the checkpoints
            logs = MetricLogs.open(args.log_dir, args.log or [], append=bool(args.resume))
        # ops that no line of the model made (the loss) are located at the model's source,
        # not at the `ember` launcher script
        with model_source(models.source_location(args.model, model)):
            if args.summary:
                say(em.summary(model, dataset.x_train[:args.batch_size]))
            results = train.fit(model, dataset, optimizer, epochs=args.epochs,
                                batch_size=args.batch_size, backend=args.backend,
                                seed=args.seed, dump_ir=args.dump_ir,
                                progress=not args.no_progress, recompute=args.recompute,
                                memory_budget=args.memory_budget, save=args.save,
                                resume=args.resume, detect_anomaly=args.detect_anomaly,
                                data_parallel=comm if comm is not None else False,
                                logs=logs, profile=args.profile, accumulate=args.accumulate,
                                shard_optimizer=args.shard_optimizer,
                                precision=args.precision,
                                on_resume=_longer_schedule(args.epochs, steps_per_epoch,
                                                           args.accumulate))
        if args.plot and logs is not None and results:
            say(f"wrote {plot_run(args.plot, results, logs.steps, steps_per_epoch)}")
    except BrokenPipeError:  # `ember train | head`: main() handles it, not an error of ours
        raise
    except (ValueError, FloatingPointError, ExecutionError, BackendUnavailableError,
            OSError, NotImplementedError, DistributedError, ImportError) as e:
        print(f"ember train: error: {e}", file=sys.stderr)
        return 1
    finally:
        if logs is not None:
            logs.close()
    if results:
        say(f"final test accuracy {results[-1].test_accuracy:.2%}")
    return 130 if results.interrupted else 0  # 128 + SIGINT, as a shell reports Ctrl-C


def _bench(args: argparse.Namespace) -> int:
    from ember.runtime import bench

    print(bench.run(models=args.models.split(","), batch_size=args.batch_size,
                    steps=args.steps, backend=args.backend, torch=not args.no_torch,
                    torch_compile=not (args.no_torch or args.no_torch_compile),
                    threads=args.threads))
    return 0


SPLIT_MARKER = re.compile(r"^[ \t]*// -----[ \t]*$", re.M)  # mlir-opt's --split-input-file
MAX_TEXT = 1 << 28  # bytes of IR text `ember opt` reads (a model's graph is far smaller)


def _opt(args: argparse.Namespace) -> int:
    """As mlir-opt: each input (the file, or each `// -----` chunk of it) is parsed, run
    through the passes and printed; an error is reported per chunk, and the output goes to
    stdout, or to `-o FILE` (written atomically, and only when every chunk succeeded)."""
    from ember.backends.errors import CodegenError, UnsupportedOpError
    from ember.ir import VerifyError
    from ember.ir.diagnostic import render
    from ember.ir.parser import ParseError, decode
    from ember.passes.manager import PassManager, PipelineError, parse_pipeline

    errors = (OSError, ParseError, VerifyError, PipelineError, UnsupportedOpError,
              CodegenError, ValueError)  # ValueError: OnnxImportError, a bad --input-shape
    name = "<stdin>" if args.file == "-" else args.file
    text = None
    try:  # the command line's own mistakes first, once, as a usage error
        passes = parse_pipeline(args.passes or "")
        PassManager(passes, print_ir_after=args.print_ir_after or ())  # rejects typos
    except PipelineError as e:
        print(f"ember opt: error: {e}", file=sys.stderr)
        return 1
    try:
        if args.file.endswith(".onnx"):
            inputs = [_onnx_graph(args.file, args.input_shape or [])]
        else:
            from ember.files import read_limited

            data = read_limited(args.file, MAX_TEXT, "input")
            text = decode(data)
            inputs = _chunks(text) if args.split_input_file else [text]
    except errors as e:
        print(render(name, e, text), file=sys.stderr)
        return 1
    outputs, failed = [], False
    for source in inputs:
        manager = PassManager(passes, verify_each=args.verify_each,
                              print_ir_after_all=args.print_ir_after_all,
                              print_ir_after=args.print_ir_after or (), timing=args.pass_timing)
        try:
            outputs.append(_opt_one(source, manager, args))
        except errors as e:
            print(render(name, e, text), file=sys.stderr)
            failed = True
            continue
        if args.pass_timing:
            print(manager.timing_report(), file=sys.stderr)
    result = "// -----\n".join(outputs)
    if args.output is None:
        print(result, end="")
    elif not failed:
        from ember.files import write_atomically

        try:
            write_atomically(args.output, result.encode())
        except OSError as e:
            print(f"ember opt: error: cannot write {args.output}: {e.strerror or e}",
                  file=sys.stderr)
            return 1
    return 1 if failed else 0


def _chunks(text: str) -> list[str]:
    """The `// -----` chunks of `text`, each padded with the newlines before it, so that
    its errors name lines of the whole file."""
    out, start = [], 0
    for m in [*SPLIT_MARKER.finditer(text), None]:
        stop = len(text) if m is None else m.start()
        out.append("\n" * text.count("\n", 0, start) + text[start:stop])
        start = stop if m is None else m.end()
    return out


def _opt_one(source, manager, args: argparse.Namespace) -> str:
    """One input (text, or a traced graph) through the passes, as --emit asks."""
    from ember.ir import verify
    from ember.ir.parser import parse

    graph = verify(parse(source) if isinstance(source, str) else source)
    return _emit(verify(manager.run(graph)), args.emit, args.debuginfo)


def _onnx_graph(path: str, shapes: list[str]):
    """An ONNX model's forward, traced for its declared input shapes (or `name=1x3x8x8`)."""
    import ember as em

    given = {}
    for text in shapes:
        name, sep, dims = text.rpartition("=")
        try:
            given[name] = tuple(int(d) for d in dims.split("x"))
        except ValueError:
            given[name] = None
        if not sep or given[name] is None:
            raise ValueError(f"--input-shape {text!r}: want NAME=DIMS, e.g. x=1x3x32x32")
    model = em.onnx.load(path)
    return em.trace(model, *model.input_specs(given))


def _emit(graph, emit: str, debuginfo: bool) -> str:
    """What `ember opt` prints: the IR, or the LLVM IR or CUDA C a backend compiles from it
    (UnsupportedOpError for ops it has no kernel for, such as nn.* before `decompose`)."""
    if emit == "llvm":
        from ember.backends.cpu import emit_llvm

        return emit_llvm(graph) + "\n"
    if emit == "cuda":
        from ember.backends.cuda import emit_cuda

        return emit_cuda(graph)
    if emit == "dot":
        from ember.ir.dot import to_dot

        return to_dot(graph)
    from ember.ir.printer import print_graph

    return print_graph(graph, debuginfo=debuginfo)


class _Print(argparse.Action):
    """An option that prints `text()` and exits, as `--help` does (`--help-env`: the
    EMBER_* switches of settings.py; `--list-passes`: the registered passes)."""

    def __init__(self, option_strings, dest, text, **kwargs):
        super().__init__(option_strings, dest, nargs=0, **kwargs)
        self.text = text

    def __call__(self, parser, namespace, values, option_string=None):
        print(self.text())
        parser.exit()


def _environment_switches() -> str:
    from ember.settings import describe

    return describe()


def _passes() -> str:
    from ember.passes.manager import describe_passes

    return describe_passes()


class _RecomputeOption(argparse.Action):
    """--recompute, also under its deprecated old name --checkpoint (which now means
    saving training state: --save, --resume)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string == "--checkpoint":
            print("ember: --checkpoint is deprecated: use --recompute", file=sys.stderr)
        setattr(namespace, self.dest, values)


def main(argv: list[str] | None = None) -> int:
    from ember import __version__
    from ember.passes.manager import describe_passes
    from ember.runtime.api import recompute_strategies
    from ember.runtime.precision import PRECISIONS

    parser = argparse.ArgumentParser(prog="ember", description=__doc__)
    parser.add_argument("--version", action="version", version=f"ember {__version__}")
    parser.add_argument("--help-env", action=_Print, text=_environment_switches,
                        help="list the EMBER_* environment variables ember reads, and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a built-in model on built-in data")
    t.add_argument("--model", default="mlp", help="mlp, cnn, path/to/file.py:ClassName, or an "
                   ".onnx classifier to fine-tune; a class whose first layer is a Conv2d gets "
                   "the digits as [N, 1, 8, 8] images, one whose first is a Linear as [N, 64] "
                   "rows (or set `image = True`/`False` on the class)")
    t.add_argument("--data", default=None, help=".npz with x and y (default: digits)")
    t.add_argument("--optimizer", choices=("sgd", "adam", "adamw"), default="sgd")
    t.add_argument("--lr", type=_number(positive=True), default=None,
                   help="default: 0.05 for sgd, else 1e-3")
    t.add_argument("--schedule", choices=("constant", "step", "cosine"), default="constant",
                   help="lr schedule over the run (step: x0.1 at each third)")
    t.add_argument("--warmup", type=_count(0), default=0, metavar="STEPS", help="linear lr warmup")
    t.add_argument("--momentum", type=_number(), default=0.9, help="for sgd")
    t.add_argument("--weight-decay", type=_number(), default=None,
                   help="default: 0, or 1e-2 for adamw (PyTorch's)")
    t.add_argument("--clip-norm", type=_number(), default=0.0,
                   help="clip gradients to this global L2 norm (0: off)")
    t.add_argument("--epochs", type=_count(1), default=10, help="epochs in the whole run (resume "
                   "counts those already done)")
    t.add_argument("--batch-size", type=_count(1), default=32)
    t.add_argument("--accumulate", type=_count(1), default=1, metavar="K",
                   help="gradient accumulation: one optimizer update per K batches (of "
                   "--batch-size each, weighted 1/K: with the mean loss, one step on K x the "
                   "batch); the lr schedule counts updates")
    t.add_argument("--shard-optimizer", action="store_true",
                   help="with --nproc: each rank keeps the optimizer state of its share of "
                   "the params (ZeRO-1); checkpoints hold all of it")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--backend", choices=("cpu", "interpreter", "cuda"), default="cpu")
    t.add_argument("--recompute", "--checkpoint", default="none", choices=recompute_strategies(),
                   action=_RecomputeOption, help="activation checkpointing: what the "
                   "backward recomputes (--checkpoint: its deprecated old name)")
    t.add_argument("--memory-budget", type=int, default=None, metavar="BYTES",
                   help="planned peak memory of the step (implies --recompute min-cut)")
    t.add_argument("--precision", choices=tuple(PRECISIONS), default="32",
                   help="mixed precision, as Lightning's: matmuls, linear layers, convolutions "
                   "and attention in bf16 or f16 (16-mixed scales the loss), the rest, the "
                   "params and the optimizer in f32")
    t.add_argument("--dump-ir", metavar="DIR", help="write the IR of every stage to DIR")
    t.add_argument("--save", metavar="PATH", help="checkpoint after each epoch and on Ctrl-C")
    t.add_argument("--resume", metavar="PATH", help="continue a run from a --save checkpoint, "
                   "with its optimizer and lr schedule; a larger --epochs recomputes a cosine "
                   "or step schedule over the longer run (as that many epochs from the start "
                   "would have it; a note gives the lr)")
    t.add_argument("--detect-anomaly", action="store_true",
                   help="check every step for NaN/Inf and name the op that produced it")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--log-dir", metavar="DIR", help="write metrics per step and per epoch to "
                   "DIR/metrics.jsonl, DIR/metrics.csv and TensorBoard events (if installed)")
    t.add_argument("--log", action="append", metavar="FILE", help="write metrics to FILE "
                   "(.jsonl or .csv; repeatable)")
    t.add_argument("--plot", metavar="PATH.png", help="plot loss and accuracy at the end "
                   "(needs matplotlib: pip install 'ember[plot]')")
    t.add_argument("--summary", action="store_true", help="print the model's layers, output "
                   "shapes, params and FLOPs before training")
    t.add_argument("--profile", metavar="PATH.json", help="at the end, time the step's kernels "
                   "on one batch and write a Chrome/Perfetto trace (cpu backend)")
    t.add_argument("--nproc", type=_count(1), default=1, metavar="N",
                   help="data-parallel over N processes on this machine (runs torchrun; "
                   "--batch-size is per process)")
    t.set_defaults(run=_train)

    bn = sub.add_parser("bench", help="step time of the built-in models vs numpy and PyTorch")
    bn.add_argument("--models", default="mlp,cnn", help="comma-separated: mlp, cnn")
    bn.add_argument("--batch-size", type=_count(1), default=32)
    bn.add_argument("--steps", type=_count(1), default=200, help="timed steps per row")
    bn.add_argument("--backend", choices=("cpu", "interpreter", "cuda"), default="cpu")
    bn.add_argument("--no-torch", action="store_true", help="skip PyTorch rows")
    bn.add_argument("--no-torch-compile", action="store_true", help="skip torch.compile rows")
    bn.add_argument("--threads", type=int, default=1, help="PyTorch threads (0: its default)")
    bn.set_defaults(run=_bench)

    o = sub.add_parser("opt", help="parse IR, run passes, print the result (as mlir-opt)",
                       epilog=f"passes:\n{describe_passes()}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    o.add_argument("file", nargs="?", default="-", help="an .mlir file, an .onnx model (its "
                   "forward is printed), or - for stdin (the default)")
    o.add_argument("-o", dest="output", metavar="FILE", help="write the output here "
                   "(atomically) instead of to stdout")
    o.add_argument("--split-input-file", action="store_true",
                   help="process each '// -----' chunk of the input on its own")
    o.add_argument("--list-passes", action=_Print, text=_passes, help="list the passes and exit")
    o.add_argument("--input-shape", action="append", metavar="NAME=DIMS",
                   help="an .onnx input's shape, e.g. x=1x3x32x32 (for symbolic dims)")
    o.add_argument("-p", "--passes", default="", help="e.g. 'decompose{linear=split},autodiff'")
    o.add_argument("--print-ir-after-all", action="store_true")
    o.add_argument("--print-ir-after", action="append", metavar="PASS")
    o.add_argument("--verify-each", action="store_true")
    o.add_argument("--pass-timing", action="store_true")
    o.add_argument("--mlir-print-debuginfo", dest="debuginfo", action="store_true")
    o.add_argument("--emit", choices=("mlir", "llvm", "cuda", "dot"), default="mlir",
                   help="the IR, the LLVM IR or CUDA C a backend compiles, or Graphviz dot")
    o.set_defaults(run=_opt)

    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return args.run(args)
    except BrokenPipeError:  # `ember opt f.mlir | head`: the reader left; that is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
