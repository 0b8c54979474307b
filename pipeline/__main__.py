"""The release pipeline's stages, one command each (nox sessions call these).

    python -m pipeline build --target cpu [--python 3.11]
    python -m pipeline audit --target cpu [--static-only]

Targets default to those of release.toml's default profile (--profile picks
another). A fatal error prints its message and exits with its own code.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from pipeline import config
from pipeline.config import ROOT, Target
from pipeline.container import ContainerEngine
from pipeline.errors import ConfigError, PipelineError
from pipeline.host import ensure_container_engine


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=["images", "build", "audit"])
    parser.add_argument("--target", action="append", help="a target of release.toml (repeatable)")
    parser.add_argument("--profile", help="a profile of release.toml: build its targets")
    parser.add_argument("--python", action="append", help="only these Python versions (X.Y)")
    parser.add_argument("--static-only", action="store_true",
                        help="audit: skip the load check in a runtime container")
    return parser.parse_args(argv)


def select_targets(cfg: config.ReleaseConfig, args: argparse.Namespace) -> list[Target]:
    profile = args.profile or cfg.default_profile
    if profile not in cfg.profiles:
        raise ConfigError(f"no profile {profile!r}; profiles: {', '.join(cfg.profiles)}")
    targets = [cfg.target(n) for n in (args.target or cfg.profiles[profile].targets)]
    if args.python:
        for t in targets:
            unknown = sorted(set(args.python) - set(t.python))
            if unknown:
                raise ConfigError(f"--python {unknown[0]}: target {t.name} builds "
                                  f"{', '.join(t.python)} (release.toml [targets.{t.name}] python)")
        targets = [dataclasses.replace(t, python=tuple(args.python)) for t in targets]
    return targets


def main(argv: list[str]) -> int:
    args = parse(argv)
    try:
        cfg = config.load()
        targets = select_targets(cfg, args)
        ensure_container_engine(cfg.container_engine, log_dir=ROOT / "build" / "logs")
        engine = ContainerEngine(name=cfg.container_engine)
        for target in targets:
            run(args, engine, target)
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    return 0


def run(args: argparse.Namespace, engine: ContainerEngine, target: Target) -> None:
    from pipeline import audit, build, images

    out = build.target_dir(target)
    if args.stage == "images":
        for ref, image in (images.builder_image(engine, target), images.runtime_base_image(engine, target)):
            print(f"{target.name}: {ref} ({image})", flush=True)
    elif args.stage == "build":
        record = build.build(engine, target)
        print(f"{target.name}: built {', '.join(w['file'] for w in record['wheels'])} "
              f"in {record['seconds']} s", flush=True)
    else:
        audit.audit(None if args.static_only else engine, target, out / "wheels",
                    out / "audit.json")
        print(f"{target.name}: payload audit passed ({out / 'audit.json'})", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
