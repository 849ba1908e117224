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
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import lessons

COMMANDS = {
    "ladder": "check and time every GEMM stage against cuBLAS, with each stage's speed of light (without a GPU: "
              "simulate, compile, and table the committed GPU run)",
    "inspect": "PTX excerpt, registers, spills, shared memory and SASS opcodes of any stage 0-10 (no GPU needed)",
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
    ladder.add_argument("--out", type=Path, default=Path("results"), help="folder for ladder.json and .png")
    ladder.add_argument("--sim-shape", type=_shape, default=(32, 48, 256),
                        help="M,N,K for the simulator run when there is no GPU (default 32,48,256)")
    inspect.add_argument("stage", type=_stage_number, help=f"0-10: {_stage_names()}")
    diff.add_argument("before", type=_stage_number)
    diff.add_argument("after", type=_stage_number)
    from lessons.ablate import stages_with_ablations
    ablate.add_argument("stage", type=_ablation_stage, help="a stage that bundles ideas: "
                        + ", ".join(f"{n:02d}" for n in stages_with_ablations()))
    ablate.add_argument("--out", type=Path, default=Path("results"), help="folder for ablation_NN.json")
    from lessons.grade import DEFAULT_SEEDS, DEFAULT_TIMEOUT_S, SECRET_ENV
    grade.add_argument("stage", type=_stage_number, help=f"0-10: {_stage_names()}")
    which = grade.add_mutually_exclusive_group(required=True)
    which.add_argument("solution", type=Path, nargs="?", help="the student's file (the skeleton with its holes "
                       "filled)")
    which.add_argument("--reference", action="store_true", help="grade the stage's own code instead (instructors: "
                       "the run thresholds are set from, tools/calibrate_grader.py)")
    which.add_argument("--class", dest="class_dir", type=Path, default=None, metavar="DIR",
                       help="grade every submission in DIR (DIR/<student>.py or DIR/<student>/<file>.py) into a CSV "
                            "gradebook, Gradescope results.json files and JUnit XML (docs/course.md)")
    grade.add_argument("--jobs", type=int, default=4, help="submissions graded at once with --class (default 4)")
    grade.add_argument("--out", type=Path, default=None, help="where --class writes (default DIR/grades)")
    grade.add_argument("--allow-copies", action="store_true", help="report holes that are the stage's own code "
                       "(names and formatting aside) without failing them")
    where = grade.add_mutually_exclusive_group()
    where.add_argument("--gpu", action="store_true", help="the real kernel on a Hopper GPU, timed (default there)")
    where.add_argument("--cpu", action="store_true", help="the simulator / PTX emulator at small shapes (default "
                       "without a Hopper GPU)")
    grade.add_argument("--json", type=Path, default=None, help="write the JSON report here")
    grade.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help=f"public seeds per shape (default "
                       f"{DEFAULT_SEEDS}); as many secret ones are added when {SECRET_ENV} is set")
    grade.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds the solution's process "
                       f"may run (default {DEFAULT_TIMEOUT_S})")
    grade.add_argument("--thresholds", type=Path, default=None, help="per-stage performance thresholds (default "
                       "results/grading.json)")
    grade.add_argument("--exercise-file", default=None, help=argparse.SUPPRESS)  # EXERCISE from a file: tests, drafts
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


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:  # no command: say what there is
        parser.print_help()
        return 0
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
        from lessons.grade import main as grade
        return grade(args)
    if args.command == "diff":
        from lessons.diff_stages import diff
        return diff(args.before, args.after, args.m, args.n, args.k)
    if args.command == "ablate":
        from lessons.ablate import ablate
        try:
            return ablate(args.stage, args.m, args.n, args.k, args.out)
        except ValueError as error:  # a stage that bundles nothing to ablate
            parser.exit(2, f"python -m lessons ablate: {error}\n")
    from lessons.inspect_stage import inspect
    return inspect(args.stage, args.m, args.n, args.k)


if __name__ == "__main__":
    sys.exit(main())
