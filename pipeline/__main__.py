"""The release pipeline's stages, one command each (nox sessions call these).

    python -m pipeline images --target cpu
    python -m pipeline build --target cpu [--python 3.11]
    python -m pipeline audit --target cpu [--static-only]
    python -m pipeline patch-vllm --target cpu [--vllm X.Y.Z] [--rebase] [--no-verify]
    python -m pipeline check-tree [--allow-dirty]
    python -m pipeline runtime-image --target cpu
    python -m pipeline manifest [--profile P] [--key ed25519.pem]
    python -m pipeline publish [--profile P]
    python -m pipeline verify MANIFEST --fingerprint SHA256:... --wheels DIR [--files DIR] [--image REF]

Targets default to those of release.toml's default profile (--profile picks
another). A fatal error prints its message and exits with its own code.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from pipeline import config, publish, release, verify
from pipeline.config import ROOT, Target
from pipeline.container import ContainerEngine
from pipeline.errors import ConfigError, PipelineError
from pipeline.host import ensure_container_engine


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=["images", "build", "audit", "patch-vllm", "check-tree",
                                          "runtime-image", "manifest", "publish", "verify"])
    parser.add_argument("manifest", nargs="?", type=Path, help="verify: the manifest to check")
    parser.add_argument("--target", action="append", help="a target of release.toml (repeatable)")
    parser.add_argument("--profile", help="a profile of release.toml: build its targets")
    parser.add_argument("--python", action="append", help="only these Python versions (X.Y)")
    parser.add_argument("--static-only", action="store_true",
                        help="audit: skip the load check in a runtime container")
    parser.add_argument("--vllm", help="patch-vllm: this vLLM version instead of release.toml's")
    parser.add_argument("--rebase", action="store_true",
                        help="patch-vllm: try the nearest series on --vllm and report each hunk")
    parser.add_argument("--no-verify", action="store_true",
                        help="patch-vllm: skip the clean-venv generation check")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="check-tree: release from uncommitted changes (recorded in the manifest)")
    parser.add_argument("--key", help="manifest: the Ed25519 signing key (PEM, mode 0600; or "
                        "ACTIVEKV_SIGNING_KEY; passphrase: ACTIVEKV_SIGNING_KEY_PASSPHRASE or asked)")
    verify.add_arguments(parser)
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
        if args.stage == "check-tree":
            release.check_tree(allow_dirty=args.allow_dirty)
            print("the working tree is clean" if not args.allow_dirty else "dirty tree allowed", flush=True)
            return 0
        if args.stage == "verify":
            return verify.command(args)
        cfg = config.load()
        targets = select_targets(cfg, args)
        if args.stage == "patch-vllm":
            for target in targets:
                patch_stage(args, cfg, target)
            return 0
        ensure_container_engine(cfg.container_engine, log_dir=ROOT / "build" / "logs")
        engine = ContainerEngine(name=cfg.container_engine)
        profile = cfg.profiles[args.profile or cfg.default_profile]
        if args.stage == "manifest":
            path = release.make_manifest(engine, profile, cfg, args.key)
            print(f"signed manifest: {path.relative_to(ROOT)}", flush=True)
            return 0
        if args.stage == "publish":
            record = publish.publish(release.latest_manifest(), artifact_dirs=release.artifact_dirs(),
                                     dest=release.destinations(profile, engine))
            print(f"published {record['version']}: {len(record['wheels'])} wheel(s), "
                  f"{len(record['images'])} image(s), {record['skipped']} already there; "
                  f"manifest {record['manifest']}", flush=True)
            return 0
        for target in targets:
            if args.stage == "runtime-image":
                r = release.make_runtime_image(engine, target, cfg)
                print(f"{target.name}: {r['ref']} ({r['id']})", flush=True)
            else:
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


def patch_stage(args: argparse.Namespace, cfg: config.ReleaseConfig, target: Target) -> None:
    import json

    from pipeline import build, patch_vllm

    version = args.vllm or cfg.vllm_version
    dist = target.vllm_distribution
    if args.rebase:
        report = patch_vllm.rebase(dist, version)
        for h in report:
            where = f"{h.file}:{h.line}" if h.line else h.file
            print(f"{'ok    ' if h.ok else 'FAILED'} {h.patch} hunk {h.hunk} {where}: {h.detail}")
        failed = [h for h in report if not h.ok]
        if failed:
            raise patch_vllm.PatchError(f"{len(failed)} hunk(s) of the nearest series do not apply "
                                        f"to {dist} {version} (listed above)")
        print(f"every patch applies exactly to {dist} {version}: copy the series to "
              f"patches/vllm/{version}/ and re-pin", flush=True)
        return
    record = patch_vllm.patch_vllm(dist, version, epoch=int(build.source_date_epoch()))
    out = patch_vllm.OUT_DIR / f"{dist}-{version}"
    print(f"{target.name}: {record['patched']['file']} ({out})", flush=True)
    if args.no_verify:
        return
    if target.name != "cpu":
        print(f"{target.name}: not verified here: running vLLM for this target needs its "
              f"accelerator; verify with --target cpu on this host", flush=True)
        return
    wheels = sorted((build.target_dir(target) / "wheels").glob("*.whl"))
    outcome = patch_vllm.verify(record, out, wheels, ROOT / "packaging" / "cpu" / "constraints.txt")
    record["verified"] = outcome
    (out / "patch.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"{target.name}: verified: {outcome['vllm']} generated with ActiveKV, "
          f"{outcome['cached_tokens']} tokens from the host store", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
