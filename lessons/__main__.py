"""``python -m lessons ladder|inspect|diff|ablate|grade|figures|notebooks``: run, inspect, compare, ablate stages;
grade an exercise; redraw the course's figures; write, check or execute its notebooks.

    python -m lessons ladder [--m 4096 --n 4096 --k 7168] [--stages 1,2,3] [--no-peer] [--out results]
    python -m lessons inspect 3         # PTX excerpt, registers, spills, SASS opcodes, speed of light (no GPU needed)
    python -m lessons diff 6 7          # config, PTX and SASS-opcode difference (no GPU needed)
    python -m lessons ablate 8          # each bundled idea of a stage turned off, timed (GPU)
    python -m lessons grade 1 my_ex01.py [--cpu|--gpu] [--json report.json] [--seeds 2]   # docs/course.md
    python -m lessons grade 4 --reference --gpu   # the stage's own code: the run the thresholds come from
    python -m lessons grade 6 --class submissions/ --jobs 8   # a class into grades/gradebook.csv (docs/course.md)
    python -m lessons figures [--check]  # redraw docs/figures/*.png from the kernels' layout functions (no GPU)
    python -m lessons notebooks [--check]  # write notebooks/*.ipynb from lessons/notebooks/ (no GPU)
    python -m lessons notebooks --execute [05 precision]  # run them and store their outputs (GPU ones on a GPU)
    python -m lessons precision [--training]  # FP8 precision tables; --training: forward, dgrad, wgrad (no GPU)
    python -m lessons calibrate --stages 4-10   # the grader's thresholds from the stages' own code (GPU)
    python -m lessons docs --check      # are docs/ and the stages' "Measured:" lines up to date with results/?
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import lessons
from lessons import results_store

COMMANDS = {
    "ladder": "check and time every GEMM stage against cuBLAS, with each stage's speed of light (without a GPU: "
              "simulate, compile, and table the committed GPU run)",
    "inspect": "PTX excerpt, registers, spills, shared memory and SASS opcodes of any stage 0-12 (no GPU needed)",
    "diff": "config, PTX and SASS difference between two PTX stages (no GPU needed)",
    "ablate": "time a stage with each of its bundled ideas turned off (GPU)",
    "grade": "grade a course exercise's solution: correctness on fresh (and secret) seeds, technique, performance "
             "against the stage's speed of light (GPU); see docs/course.md",
    "figures": "redraw docs/figures/*.png from the layout functions the kernels use, or --check the committed ones "
               "(no GPU; needs matplotlib, the plots extra)",
    "notebooks": "write notebooks/*.ipynb from their cells in lessons/notebooks/, --check the committed ones, or "
                 "--execute them and store their outputs",
}


def _stage_names() -> str:
    return ", ".join(f"{n:02d} {name.split('_', 1)[1]}" for n, name in sorted(lessons.STAGES.items()))


def _stage_number(text: str) -> int:
    """A stage number that exists: anything else is a usage error naming the stages, not a traceback."""
    try:
        number = int(text)
    except ValueError:
        number = None
    if number not in lessons.STAGES:
        low, high = min(lessons.STAGES), max(lessons.STAGES)
        raise argparse.ArgumentTypeError(f"no stage {text!r}: stages are {low}-{high} ({_stage_names()})")
    return number


def _ablation_stage(text: str) -> int:
    """A stage that declares ABLATIONS (it bundles ideas); an unknown stage is the usual usage error."""
    number = _stage_number(text)
    from lessons.ablate import stages_with_ablations
    bundled = stages_with_ablations()
    if number not in bundled:
        raise argparse.ArgumentTypeError(f"stage {number:02d} lists no ABLATIONS (it adds one idea): the stages "
                                         f"with ablations are {', '.join(f'{n:02d}' for n in bundled)}")
    return number


def _stage_list(text: str) -> list[int]:
    """"1,2,5" or "1-6" (or a mix) -> sorted stage numbers."""
    numbers = set()
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            low, _, high = part.partition("-")
            numbers.update(range(int(low), int(high or low) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected stage numbers like "1,2,3" or "1-6", got {text!r}') from None
    unknown = sorted(numbers - set(lessons.GEMM_STAGES))
    if unknown:
        raise argparse.ArgumentTypeError(f"no GEMM stage {unknown}: the ladder's stages are "
                                         f"{min(lessons.GEMM_STAGES)}-{max(lessons.GEMM_STAGES)}")
    return sorted(numbers)


def _shape(text: str) -> tuple[int, int, int]:
    try:
        values = tuple(int(v) for v in text.replace("x", ",").split(","))
    except ValueError:
        values = ()
    if len(values) != 3:
        raise argparse.ArgumentTypeError(f"expected M,N,K, got {text!r}")
    return values


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lessons", description="The FP8 GEMM ladder: run it, look inside "
                                     "a stage, compare two, ablate one.",
                                     epilog="examples:\n" + "\n".join(__doc__.split("\n")[2:]).rstrip(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}",
                                     title="commands (python -m lessons COMMAND -h for its options)")
    ladder, inspect, diff, ablate, grade = (commands.add_parser(name, help=COMMANDS[name], description=COMMANDS[name])
                                            for name in ("ladder", "inspect", "diff", "ablate", "grade"))
    _add_figures(commands)
    _add_notebooks(commands)
    for sub in (ladder, inspect, diff, ablate):
        sub.add_argument("--m", type=int, default=4096, help="rows of A and D (default 4096)")
        sub.add_argument("--n", type=int, default=4096, help="rows of B, columns of D (default 4096)")
        sub.add_argument("--k", type=int, default=7168, help="reduction length, a multiple of 128 (default 7168)")
    ladder.add_argument("--stages", type=_stage_list, default=None, help='e.g. "1,2,3" or "1-6" (default: all)')
    ladder.add_argument("--no-peer", action="store_true", help="skip the cuBLAS blockwise peer")
    ladder.add_argument("--out", type=Path, default=None, help="folder for ladder.json and .png (default: results/ "
                        "in a checkout, the user results folder in an installed package: lessons.results_store)")
    ladder.add_argument("--sim-shape", type=_shape, default=(32, 48, 256),
                        help="M,N,K for the simulator run when there is no GPU (default 32,48,256)")
    inspect.add_argument("stage", type=_stage_number, help=f"0-{max(lessons.STAGES)}: {_stage_names()}")
    diff.add_argument("before", type=_stage_number)
    diff.add_argument("after", type=_stage_number)
    from lessons.ablate import stages_with_ablations
    ablate.add_argument("stage", type=_ablation_stage, help="a stage that bundles ideas: "
                        + ", ".join(f"{n:02d}" for n in stages_with_ablations()))
    ablate.add_argument("--out", type=Path, default=None, help="folder for ablation_NN.json (default: as ladder's)")
    from lessons.grading.command import add_arguments as add_grade_arguments
    grade.add_argument("stage", type=_stage_number, help=f"0-{max(lessons.STAGES)}: {_stage_names()}")
    add_grade_arguments(grade)
    _add_calibrate(commands)
    _add_docs(commands)
    _add_precision(commands)
    commands.metavar = "{" + ",".join(commands.choices) + "}"
    return parser


def _add_figures(commands) -> None:
    figures = commands.add_parser("figures", help=COMMANDS["figures"], description=COMMANDS["figures"])
    figures.add_argument("names", nargs="*", help="figures to write (default: all), e.g. 08_tile_raster")
    figures.add_argument("--check", action="store_true", help="verify the committed figures (set, manifest hashes, "
                         "each still draws, and the same bytes where matplotlib and FreeType are the manifest's); "
                         "write nothing")
    figures.set_defaults(handler=lambda args: _figures(figures, args))


def _figures(parser: argparse.ArgumentParser, args) -> int:
    try:
        from lessons.figures import committed
    except ModuleNotFoundError as error:  # matplotlib is the plots extra, not a core dependency
        if error.name is None or not error.name.startswith("matplotlib"):
            raise
        parser.exit(1, "python -m lessons figures needs matplotlib: pip install -e '.[plots]'\n")
    if not committed.FIGURE_DIR.parent.is_dir():  # an installed package has no docs/ to draw into
        parser.exit(1, f"python -m lessons figures works in a checkout of the repository: no {committed.FIGURE_DIR}\n")
    unknown = [name for name in args.names if name not in committed.FIGURES]
    if unknown:
        parser.error(f"unknown figure(s) {unknown}; known: {', '.join(committed.FIGURES)}")
    if args.check:
        if args.names:
            parser.error("--check checks every figure")
        return committed.check()
    return committed.write(args.names or list(committed.FIGURES))


def _add_notebooks(commands) -> None:
    notebooks = commands.add_parser("notebooks", help=COMMANDS["notebooks"], description=COMMANDS["notebooks"])
    what = notebooks.add_mutually_exclusive_group()
    what.add_argument("--check", action="store_true", help="compare with the committed notebooks, outputs stripped; "
                      "write nothing")
    what.add_argument("--execute", nargs="*", metavar="NOTEBOOK", default=None, help="run these notebooks (paths, "
                      "names or stage numbers: 05, precision; none: all) and store their outputs")
    notebooks.add_argument("--timeout", type=int, default=600, help="--execute: seconds per cell (default 600)")
    notebooks.add_argument("--engine", choices=("auto", "nbclient", "exec"), default="auto", help="--execute: "
                           "nbclient (a Jupyter kernel), exec (no Jupyter needed), auto (nbclient when installed)")
    notebooks.set_defaults(handler=lambda args: _notebooks(notebooks, args))


def _notebooks(parser: argparse.ArgumentParser, args) -> int:
    from lessons.notebooks import CHECKOUT
    if not (CHECKOUT / "notebooks").is_dir():  # an installed package has no notebooks/ beside it
        parser.exit(1, f"python -m lessons notebooks works in a checkout of the repository: no {CHECKOUT}/notebooks\n")
    if args.execute is not None:
        from lessons.notebooks.execute import execute
        return execute(args.execute, args.timeout, args.engine)
    from lessons.notebooks.write import write
    return write(check=args.check)


def _add_calibrate(commands) -> None:
    from lessons.grading import calibrate
    text = ("set the grader's performance thresholds (results/grading.json) from each stage's own code graded on the "
            "GPU (--from-reports: from the committed reports, no GPU)")
    parser = commands.add_parser("calibrate", help=text, description=text)
    calibrate.add_arguments(parser)
    parser.set_defaults(run=calibrate.run)


def _add_precision(commands) -> None:
    text = ("the precision tables: scaling granularity, accumulation with and without promotion; --training: a "
            "training step's three GEMMs (forward, dgrad, wgrad), into results/training_precision.json (CPU, no GPU)")
    parser = commands.add_parser("precision", help=text, description=text)
    parser.add_argument("--seed", type=int, default=0, help="random operands' seed (default 0)")
    parser.add_argument("--training", action="store_true", help="the training recipe's GEMMs against the "
                        "alternatives (lessons/training_recipe.py); writes training_precision.json")
    parser.add_argument("--out", type=Path, default=None, help="--training: folder for training_precision.json "
                        "(default: as ladder's)")
    parser.set_defaults(run=_precision)


def _precision(args) -> int:
    if args.out is not None and not args.training:
        print("python -m lessons precision: --out is where --training writes; the other tables are only printed")
        return 2
    if args.training:
        from lessons.training_recipe import run
        return run(args.seed, args.out)
    from lessons.precision import print_tables
    print_tables(args.seed)
    return 0


def _add_docs(commands) -> None:
    from lessons import render_docs
    text = "regenerate the docs tables and the stages' \"Measured:\" lines from results/*.json (a checkout)"
    parser = commands.add_parser("docs", help=text, description=text)
    render_docs.add_arguments(parser)
    parser.set_defaults(run=render_docs.run)


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:  # no command: say what there is
        parser.print_help()
        return 0
    if getattr(args, "run", None) is not None:  # a command that brings its own runner
        return args.run(args)
    if getattr(args, "handler", None):  # commands that bring their own handler (_add_figures, _add_notebooks)
        return args.handler(args)
    from ptx.device import has_gpu
    if args.command == "ladder" and not has_gpu():
        # the Numba stages' correctness run needs the simulator; set before anything imports numba.cuda. inspect and
        # diff only compile (NVVM needs no GPU), so they leave it off.
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    if args.command == "ladder":
        from lessons.ladder import main as ladder
        return ladder(args)
    if args.command == "grade":
        from lessons.grading.command import main as grade
        return grade(args)
    if args.command == "diff":
        from lessons.diff_stages import diff
        return diff(args.before, args.after, args.m, args.n, args.k)
    if args.command == "ablate":
        from lessons.ablate import ablate
        try:
            return ablate(args.stage, args.m, args.n, args.k, args.out or results_store.write_dir())
        except ValueError as error:  # a stage that bundles nothing to ablate
            parser.exit(2, f"python -m lessons ablate: {error}\n")
    from lessons.inspect_stage import inspect
    return inspect(args.stage, args.m, args.n, args.k)


if __name__ == "__main__":
    sys.exit(main())
