"""The `ember` command: `ember train`, `ember opt`."""

from __future__ import annotations

import argparse
import sys


def _train(args: argparse.Namespace) -> int:
    import ember as em
    from ember.runtime import data, models, train

    em.seed(args.seed)
    dataset = data.load_npz(args.data, args.seed) if args.data else data.digits(args.seed)
    model = models.load_model(args.model, dataset.input_shape[-1], dataset.num_classes)
    opt_cls = {"sgd": em.optim.SGD, "adam": em.optim.Adam, "adamw": em.optim.AdamW}
    kwargs = {"momentum": args.momentum} if args.optimizer == "sgd" else {}
    optimizer = opt_cls[args.optimizer](lr=args.lr, **kwargs)
    print(f"training {args.model} ({model.num_params():,} params) on "
          f"{args.data or 'digits'} with {optimizer}, {args.epochs} epochs, "
          f"batch {args.batch_size}, {args.backend} backend")
    results = train.fit(model, dataset, optimizer, epochs=args.epochs,
                        batch_size=args.batch_size, backend=args.backend, seed=args.seed,
                        dump_ir=args.dump_ir, progress=not args.no_progress)
    print(f"final test accuracy {results[-1].test_accuracy:.2%}")
    return 0


def _opt(args: argparse.Namespace) -> int:
    from ember.ir import VerifyError, verify
    from ember.ir.parser import ParseError, parse
    from ember.passes.manager import PassManager, PipelineError, parse_pipeline

    name = "<stdin>" if args.file == "-" else args.file
    try:
        text = sys.stdin.read() if args.file == "-" else open(args.file).read()
        graph = verify(parse(text))
        manager = PassManager(parse_pipeline(args.passes or ""), verify_each=args.verify_each,
                              print_ir_after_all=args.print_ir_after_all,
                              print_ir_after=tuple(args.print_ir_after or ()),
                              timing=args.pass_timing)
        graph = verify(manager.run(graph))
    except (OSError, ParseError, VerifyError, PipelineError) as e:
        print(f"{name}:{e}" if isinstance(e, ParseError) else f"{name}: error: {e}",
              file=sys.stderr)
        return 1
    if args.emit == "llvm":
        from ember.backends.cpu import emit_llvm

        print(emit_llvm(graph))
    else:
        print(graph.__str__() if not args.debuginfo else _debug_text(graph), end="")
    if args.pass_timing:
        print(manager.timing_report(), file=sys.stderr)
    return 0


def _debug_text(graph) -> str:
    from ember.ir.printer import print_graph

    return print_graph(graph, debuginfo=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ember", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a built-in model on built-in data")
    t.add_argument("--model", default="mlp", help="mlp, or path/to/file.py:ClassName")
    t.add_argument("--data", default=None, help=".npz with x and y (default: digits)")
    t.add_argument("--optimizer", choices=("sgd", "adam", "adamw"), default="sgd")
    t.add_argument("--lr", type=float, default=0.05)
    t.add_argument("--momentum", type=float, default=0.9, help="for sgd")
    t.add_argument("--epochs", type=int, default=10)
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--backend", choices=("cpu", "interpreter", "cuda"), default="cpu")
    t.add_argument("--dump-ir", metavar="DIR", help="write the IR of every stage to DIR")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.set_defaults(run=_train)

    o = sub.add_parser("opt", help="parse IR, run passes, print the result (as mlir-opt)")
    o.add_argument("file", help="an .mlir file, or - for stdin")
    o.add_argument("-p", "--passes", default="", help="e.g. 'decompose{linear=split},autodiff'")
    o.add_argument("--print-ir-after-all", action="store_true")
    o.add_argument("--print-ir-after", action="append", metavar="PASS")
    o.add_argument("--verify-each", action="store_true")
    o.add_argument("--pass-timing", action="store_true")
    o.add_argument("--mlir-print-debuginfo", dest="debuginfo", action="store_true")
    o.add_argument("--emit", choices=("mlir", "llvm"), default="mlir")
    o.set_defaults(run=_opt)

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
