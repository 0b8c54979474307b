"""The release pipeline's commands (nox sessions call these).

    python -m pipeline release [--profile P] [--allow-dirty] [--key K] [--parity-evidence T=FILE]
    python -m pipeline plan [the release's flags]   its plan and cheap checks; no stage runs
    python -m pipeline STAGE [--profile P] [--target T ...] [flags]   one stage of the release

A release prints its plan first (the profile, each target's vLLM and torch,
the package index, the registry, the manifests folder, the signing key),
each stage's elapsed time as it ends, and last its outputs. `plan` prints the
plan and refuses what needs no stage to refuse: the flags, the signing key,
a dirty tree (without --allow-dirty).

Stages, in the release's order (pipeline/stages/registry.py):

    check-tree [--allow-dirty]
    build [--python X.Y]
    audit [--static-only]       (the manifest stage refuses a static-only audit)
    patch-vllm [--vllm X.Y.Z] [--rebase] [--no-verify]
    parity [--parity-evidence T=FILE]
    parity --target T --engine-wheel W --vllm-wheel V [--out FILE]   (on a host with T's accelerator)
    runtime-image
    manifest [--key ed25519.pem]
    publish

Also: `images` (the builder and runtime base images),
`verify MANIFEST --fingerprint SHA256:... --wheels DIR [--files DIR] [--image REF]`
and `verify-rebuild MANIFEST [--repo URL] [--wheels DIR] [--target T]` (the
engine wheels rebuilt from the manifest's commit in a fresh clone, compared
byte for byte: pipeline/rebuild.py).

Targets default to those of release.toml's default profile (--profile picks
another). A fatal error prints one `error:` line and exits with its own code
(pipeline/errors.py). Every command but verify, verify-rebuild and plan holds
the checkout's pipeline lock: a second run at the same time refuses, naming
the first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline import verify
from pipeline.errors import ConfigError, PipelineError
from pipeline.lock import command_line, pipeline_lock
from pipeline.run import Options, Run
from pipeline.stages import registry


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("stage", choices=["release", "plan", *registry.BY_NAME, "verify", "verify-rebuild"])
    parser.add_argument("manifest", nargs="?", type=Path, help="verify, verify-rebuild: the manifest")
    parser.add_argument(
        "--repo", help="verify-rebuild: the repository to clone the manifest's commit from (default: this checkout's)"
    )
    parser.add_argument("--target", action="append", help="a target of release.toml (repeatable)")
    parser.add_argument("--profile", help="a profile of release.toml: build its targets")
    parser.add_argument("--python", action="append", help="only these Python versions (X.Y)")
    parser.add_argument("--static-only", action="store_true", help="audit: skip the load check in a runtime container")
    parser.add_argument("--vllm", help="patch-vllm: this vLLM version instead of release.toml's")
    parser.add_argument(
        "--rebase", action="store_true", help="patch-vllm: try the nearest series on --vllm and report each hunk"
    )
    parser.add_argument("--no-verify", action="store_true", help="patch-vllm: skip the clean-venv generation check")
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="check-tree: release from uncommitted changes (recorded in the manifest)",
    )
    parser.add_argument(
        "--parity-evidence",
        action="append",
        default=[],
        metavar="TARGET=FILE",
        help="parity: the parity.json the parity stage wrote for TARGET on a host "
        "with its accelerator (for the same wheels)",
    )
    parser.add_argument(
        "--engine-wheel",
        type=Path,
        help="parity, on a host with the target's accelerator: the engine wheel to run "
        "the gate on (the release's, carried there)",
    )
    parser.add_argument(
        "--vllm-wheel", type=Path, help="parity, with --engine-wheel: the patched vLLM wheel to run it with"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="parity, with --engine-wheel: where the record goes (default build/release/<target>/parity.json)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="parity, with --engine-wheel: the harness's units run at once, each in a process "
        "of its own (a GPU host with cores and GPU memory to spare: 4)",
    )
    parser.add_argument(
        "--key",
        help="manifest: the Ed25519 signing key (PEM, mode 0600; or "
        "ACTIVEKV_SIGNING_KEY; passphrase: ACTIVEKV_SIGNING_KEY_PASSPHRASE or asked)",
    )
    verify.add_arguments(parser)
    return parser.parse_args(argv)


def options(args: argparse.Namespace) -> Options:
    evidence = {}
    for item in args.parity_evidence:
        target, sep, file = item.partition("=")
        if not sep or not target or not file:
            raise ConfigError(f"--parity-evidence {item!r}: expected TARGET=FILE (e.g. xpu=parity.json)")
        if not Path(file).is_file():
            raise ConfigError(f"--parity-evidence {item}: {file} is not a file")
        evidence[target] = Path(file).resolve()
    given = (args.engine_wheel, args.vllm_wheel)
    if any(given) and (args.stage != "parity" or not all(given) or evidence):
        raise ConfigError(
            "--engine-wheel and --vllm-wheel go together, with the parity stage alone "
            "(on a host with the target's accelerator), without --parity-evidence"
        )
    if args.out is not None and not all(given):
        raise ConfigError("--out is the record of `parity --engine-wheel W --vllm-wheel V`")
    if args.jobs < 1 or (args.jobs > 1 and not all(given)):
        raise ConfigError(f"--jobs {args.jobs}: 1 or more, for `parity --engine-wheel W --vllm-wheel V`")
    for flag, path in (("--engine-wheel", args.engine_wheel), ("--vllm-wheel", args.vllm_wheel)):
        if path is not None and not path.is_file():
            raise ConfigError(f"{flag} {path}: not a file")
    return Options(
        allow_dirty=args.allow_dirty,
        key=args.key,
        static_only=args.static_only,
        vllm=args.vllm,
        rebase=args.rebase,
        no_verify=args.no_verify,
        parity_evidence=evidence,
        parity_wheels=(args.engine_wheel.resolve(), args.vllm_wheel.resolve()) if all(given) else None,
        parity_out=args.out.resolve() if args.out is not None else None,
        parity_jobs=args.jobs,
    )


def main(argv: list[str]) -> int:
    args = parse(argv)
    try:
        if args.stage == "verify":
            return verify.command(args)
        if args.stage == "verify-rebuild":
            if args.manifest is None:
                raise ConfigError("verify-rebuild needs MANIFEST: the release's activekv-<version>.manifest.json")
            from pipeline import rebuild

            rebuild.rebuild(
                args.manifest, repo=args.repo, targets=args.target, wheels=verify.given_once(args.wheels, "--wheels")
            )
            return 0
        run = Run.create(profile=args.profile, targets=args.target, python=args.python, options=options(args))
        if args.stage == "plan":  # reads only: no lock
            registry.preflight(run)
            return 0
        with pipeline_lock(command_line()):
            if args.stage == "release":
                registry.run_release(run)
            else:
                registry.BY_NAME[args.stage].execute(run)
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
