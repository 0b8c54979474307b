"""verify: what an operator runs before installing a release.

    python -m pipeline verify MANIFEST --fingerprint SHA256:... \\
        (--wheels DIR | --index-dir DIR) [--files DIR] [--image REF ...]

Trust comes from a key pinned out of band, never from the folder the release
came in: anyone who can write that folder can re-sign the manifest and put
their own public key beside it. So verify needs `--fingerprint` (the one the
release printed; or ACTIVEKV_RELEASE_FINGERPRINT) or `--trusted-key PEM` (a key
the operator holds); the public key beside the manifest is used only when its
fingerprint is the pinned one.

Every file the manifest lists is read at one exact path, never searched for
by name: wheels at DIR/<file> (--wheels: a flat folder, as pip download or
pypiserver keep them) or DIR/<project>/<file> (--index-dir: a PEP 503
directory index); the other files (SBOM, vLLM patch, launcher) at
<files>/<file>, by default <manifest's folder>/<version>/ (the publish layout).
A path given twice, a link in place of a file, a missing file: refused.

Images are checked as the operator pulled them (--image REF, a tag or a
digest reference): the image id must be the manifest's `digest` and the label
org.activekv.manifest-inputs its `inputs_digest`. An image that was not
checked is said to be so, in its own line and in the summary.

Exit codes: 0 verified; 8 the release's bytes or signature are wrong (do not
install it); 2 the command line (a MANIFEST, key file or folder that is not
there: the message says what to give instead); 12 a key or fingerprint that
cannot be read.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import dataclasses
import hashlib
import json
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from pipeline import signing
from pipeline.errors import ConfigError, ManifestError
from pipeline.release_format import PUBLIC_KEY_FILE, WHEEL_KINDS, check_schema, project_of

FINGERPRINT_ENV = "ACTIVEKV_RELEASE_FINGERPRINT"
LABEL = "org.activekv.manifest-inputs"

# image_inspect(ref) -> (image id, labels), or None when no image `ref` is
# here; raises FileNotFoundError when the container runtime is not installed.
ImageInspect = Callable[[str], "tuple[str, dict[str, str]] | None"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verified:
    manifest: dict
    fingerprint: str  # of the key that signed it, the pinned one
    files: list[Path]
    images: list[str]  # references checked
    not_checked: list[str]  # one line each: which image, and why


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """verify's flags. Each is taken once (append, so a repeat is refused
    rather than the last one silently winning)."""
    parser.add_argument(
        "--fingerprint",
        action="append",
        help=f"verify: the release key's fingerprint (SHA256:...) as the release "
        f"printed it, pinned out of band (or {FINGERPRINT_ENV})",
    )
    parser.add_argument(
        "--trusted-key",
        type=Path,
        action="append",
        help="verify: the release's public key (PEM), as pinned out of band",
    )
    parser.add_argument(
        "--wheels", type=Path, action="append", help="verify: the folder holding the wheels (DIR/<file>)"
    )
    parser.add_argument(
        "--index-dir",
        type=Path,
        action="append",
        help="verify: a PEP 503 directory index holding the wheels (DIR/<project>/<file>)",
    )
    parser.add_argument(
        "--files",
        type=Path,
        action="append",
        help="verify: the folder of the other files (default: MANIFEST's folder/<version>)",
    )
    parser.add_argument(
        "--image",
        action="append",
        default=[],
        help="verify: an image as pulled (REGISTRY/NAME:TAG or NAME@sha256:...; repeatable)",
    )
    # The flags of the earlier form, refused with what to give instead.
    parser.add_argument("--public-key", action="append", help=argparse.SUPPRESS)
    parser.add_argument("--artifacts", action="append", help=argparse.SUPPRESS)


def command(args: argparse.Namespace, image_inspect: ImageInspect | None = None) -> int:
    """Run verify from parsed flags; print what was checked and what was not."""
    if args.public_key:
        raise ConfigError(
            "--public-key: a key found beside the manifest is no trust root; pin the "
            "release's fingerprint with --fingerprint SHA256:... (or give the key you "
            "pinned with --trusted-key PEM)"
        )
    if args.artifacts:
        raise ConfigError(
            "--artifacts: files are no longer looked up by name; give the wheels' "
            "folder with --wheels DIR (or --index-dir DIR) and, if not the publish "
            "layout, the other files' folder with --files DIR"
        )
    if args.manifest is None:
        raise ConfigError("verify needs MANIFEST: the release's activekv-<version>.manifest.json")
    if args.image and image_inspect is None:
        from pipeline import config
        from pipeline.container import ContainerRuntime

        image_inspect = ContainerRuntime(name=config.load().container_engine).inspect_image
    try:
        result = verify(
            args.manifest,
            fingerprint=given_once(args.fingerprint, "--fingerprint"),
            trusted_key=given_once(args.trusted_key, "--trusted-key"),
            wheels=given_once(args.wheels, "--wheels"),
            index_dir=given_once(args.index_dir, "--index-dir"),
            files=given_once(args.files, "--files"),
            images=args.image,
            image_inspect=image_inspect,
        )
    except OSError as e:  # a path that changed under us: still one line, naming it
        where = e.filename if isinstance(e.filename, (str, os.PathLike)) else args.manifest
        raise ManifestError(f"{where}: {e.strerror}; check the path and run verify again") from None
    m = result.manifest
    for line in result.not_checked:
        print(line, flush=True)
    unchecked = f"; {len(result.not_checked)} image(s) NOT checked (above)" if result.not_checked else ""
    print(
        f"verified: ActiveKV {m['version']} ({m['commit'][:12]}), signature by {result.fingerprint}, "
        f"{len(result.files)} files, {len(result.images)} image(s){unchecked}",
        flush=True,
    )
    return 0


def given_once(values: list | None, flag: str):
    """The one value of a flag that may be given at most once (None when not given)."""
    if values and len(values) > 1:
        raise ConfigError(
            f"{flag} given {len(values)} times ({', '.join(map(str, values))}); give it "
            f"once: each artifact is read from one exact place"
        )
    return values[0] if values else None


def verify(
    manifest_path: Path,
    *,
    fingerprint: str | None = None,
    trusted_key: Path | None = None,
    wheels: Path | None = None,
    index_dir: Path | None = None,
    files: Path | None = None,
    images: Sequence[str] = (),
    image_inspect: ImageInspect | None = None,
) -> Verified:
    """Check the manifest's signature against the pinned key, its schema,
    every file it lists (at its one path) and the images given. Raises
    ManifestError (or ConfigError for flags, SigningKeyError for keys) with a
    message naming what failed and what to do."""
    if wheels is not None and index_dir is not None:
        raise ConfigError("--wheels and --index-dir both given; give the one place the wheels are")
    data = _read_manifest(manifest_path)
    key, pinned = trust_root(manifest_path, fingerprint=fingerprint, trusted_key=trusted_key)
    sig_path = manifest_path.with_name(manifest_path.name + ".sig")
    try:
        signature = base64.b64decode(sig_path.read_bytes().strip(), validate=True)
    except FileNotFoundError:
        raise ManifestError(
            f"{sig_path}: missing; an unsigned manifest is not trusted: download the .sig published beside it"
        ) from None
    except OSError as e:
        raise ManifestError(
            f"{sig_path}: cannot be read ({e.strerror}); it must be the signature file published beside the manifest"
        ) from None
    except binascii.Error:
        raise ManifestError(f"{sig_path}: not a base64 signature; download it again") from None
    try:
        key.verify(signature, data)
    except InvalidSignature:
        raise ManifestError(
            f"{manifest_path.name}: the signature does not match the pinned key "
            f"{pinned} (the manifest was changed or signed with another key); "
            f"do not install this release"
        ) from None
    try:
        manifest = json.loads(data)
    except ValueError as e:
        raise ManifestError(f"{manifest_path}: signed but not a JSON manifest ({e})") from None
    check_schema(manifest)

    checked = [
        _check_file(path, a)
        for a, path in _locations(manifest, manifest_path, wheels=wheels, index_dir=index_dir, files=files)
    ]
    seen, not_checked = _check_images(manifest, images, image_inspect)
    return Verified(manifest=manifest, fingerprint=pinned, files=checked, images=seen, not_checked=not_checked)


def _read_manifest(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:  # a mistyped MANIFEST: the usage code, not a bad release's
        raise ConfigError(
            f"{path}: no such file; give the release's activekv-<version>.manifest.json (in its manifests destination)"
        ) from None
    except IsADirectoryError:
        raise ConfigError(
            f"{path}: a folder; give the manifest file in it (activekv-<version>.manifest.json)"
        ) from None
    except OSError as e:
        raise ManifestError(f"{path}: cannot be read ({e.strerror})") from None


def trust_root(
    manifest_path: Path, *, fingerprint: str | None, trusted_key: Path | None
) -> tuple[Ed25519PublicKey, str]:
    """The key to check the signature with and its fingerprint: the trusted
    key given, else the key beside the manifest when its fingerprint is the
    pinned one. Nothing pinned: refused."""
    if fingerprint is None and (env := os.environ.get(FINGERPRINT_ENV)):
        fingerprint = signing.parse_fingerprint(env, what=FINGERPRINT_ENV)
    elif fingerprint is not None:
        fingerprint = signing.parse_fingerprint(fingerprint)
    if trusted_key is not None:
        if not trusted_key.is_file():
            raise ConfigError(
                f"--trusted-key {trusted_key}: {'a folder' if trusted_key.is_dir() else 'no such file'}; "
                f"give the PEM file of the release key you pinned out of band, or pin "
                f"its fingerprint with --fingerprint SHA256:... instead"
            )
        key = signing.load_public_key(trusted_key, what="--trusted-key")
        have = signing.fingerprint(key)
        if fingerprint is not None and have != fingerprint:
            raise ManifestError(
                f"--trusted-key {trusted_key}: its fingerprint is {have}, not the pinned "
                f"{fingerprint}; give the key and fingerprint of the same release key"
            )
        return key, have
    if fingerprint is None:
        raise ConfigError(
            f"verify needs a trust root pinned out of band: --fingerprint SHA256:... (as "
            f"the release printed it; or {FINGERPRINT_ENV}) or --trusted-key PEM; the key "
            f"published beside the manifest proves nothing by itself"
        )
    beside = manifest_path.with_name(PUBLIC_KEY_FILE)
    key = signing.load_public_key(beside, what="the public key beside the manifest,")
    have = signing.fingerprint(key)
    if have != fingerprint:
        raise ManifestError(
            f"{beside}: its fingerprint is {have}, not the pinned {fingerprint}: the "
            f"release was re-signed with another key or is another release; do not "
            f"install it"
        )
    return key, have


def _folder(path: Path, flag: str) -> Path:
    """A folder given on the command line: a wrong one is a usage error."""
    if not path.exists():
        raise ConfigError(f"{flag} {path}: no such folder; give the folder the release's files are in")
    if not path.is_dir():
        raise ConfigError(f"{flag} {path}: not a folder; give the folder the file is in")
    return path


def _locations(
    manifest: dict, manifest_path: Path, *, wheels: Path | None, index_dir: Path | None, files: Path | None
) -> list[tuple[dict, Path]]:
    """Each listed file and the one path it is read from."""
    listed = [a for a in manifest["artifacts"] if a["kind"] != "image"]
    for a in listed:
        name = a["file"]
        if name in ("", ".", "..") or "/" in name or "\\" in name:
            raise ManifestError(
                f"{manifest_path.name}: lists {name!r}, not a plain file name; do not install this release"
            )
    found = []
    if any(a["kind"] in WHEEL_KINDS for a in listed):
        if wheels is None and index_dir is None:
            count = sum(a["kind"] in WHEEL_KINDS for a in listed)
            raise ConfigError(
                f"the manifest lists {count} wheel(s); give the folder holding them: "
                f"--wheels DIR (e.g. where pip download put them) or --index-dir DIR "
                f"(a PEP 503 directory index)"
            )
        root = _folder(wheels, "--wheels") if wheels is not None else _folder(index_dir, "--index-dir")
        for a in listed:
            if a["kind"] in WHEEL_KINDS:
                found.append((a, root / a["file"] if wheels is not None else root / project_of(a["file"]) / a["file"]))
    others = [a for a in listed if a["kind"] not in WHEEL_KINDS]
    if others:
        if files is not None:
            root = _folder(files, "--files")
        else:
            root = manifest_path.parent / manifest["version"]
            if not root.is_dir():
                raise ConfigError(
                    f"{root}: no such folder; the release's other files ("
                    f"{', '.join(a['file'] for a in others)}) are published there; "
                    f"give the folder holding them with --files DIR"
                )
        found += [(a, root / a["file"]) for a in others]
    return found


def _check_file(path: Path, artifact: dict) -> Path:
    """sha256 and size of the file at `path`, read through one descriptor
    opened without following links (a link could be re-pointed between this
    check and the install)."""
    if path.is_symlink():
        raise ManifestError(
            f"{path}: a symbolic link (to {os.readlink(path)}), not the file itself; "
            f"put the file there (cp --dereference) and verify that"
        )
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise ManifestError(
            f"{path}: missing; the manifest lists {artifact['file']} ({artifact['kind']}, "
            f"target {artifact['target']}): download it to exactly this path"
        ) from None
    except OSError as e:
        raise ManifestError(f"{path}: cannot be read ({e.strerror})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ManifestError(f"{path}: not a regular file; put the release's {artifact['file']} there")
    with os.fdopen(fd, "rb") as f:
        h = hashlib.sha256()
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    if info.st_size != artifact["size"] or h.hexdigest() != artifact["sha256"]:
        raise ManifestError(
            f"{path.name}: sha256 or size differs from the manifest: "
            f"tampered or not this release's file; do not install it"
        )
    return path


def image_name(ref: str) -> str:
    """The repository's last component: REGISTRY/NAME:TAG or NAME@sha256:... -> NAME."""
    return ref.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]


def _check_images(manifest: dict, refs: Sequence[str], inspect: ImageInspect | None) -> tuple[list[str], list[str]]:
    listed = [a for a in manifest["artifacts"] if a["kind"] == "image"]
    names = {image_name(a["ref"]) for a in listed}
    for ref in refs:
        if image_name(ref) not in names:
            raise ConfigError(
                f"--image {ref}: the manifest lists no image {image_name(ref)} "
                f"(it lists: {', '.join(sorted(names)) or 'none'})"
            )
    checked, not_checked = [], []
    for a in listed:
        name = image_name(a["ref"])
        mine = [r for r in refs if image_name(r) == name]
        if not mine:
            not_checked.append(
                f"image {name} (target {a['target']}): not checked: no --image given; "
                f"pull the published image and pass --image REGISTRY/{name}:"
                f"{manifest['version']}"
            )
            continue
        for ref in mine:
            try:
                seen = inspect(ref) if inspect is not None else None
            except FileNotFoundError:
                seen = inspect = None
            if inspect is None:  # asked for, and not done: a script gating on the exit code must see it
                raise ManifestError(
                    f"image {ref}: could not be checked: no container engine here to "
                    f"inspect it; verify where the image is pulled (or leave out --image "
                    f"to check the files only)"
                )
            if seen is None:
                raise ManifestError(f"image {ref}: not here; pull it first (docker pull {ref}) and verify again")
            image_id, labels = seen
            if image_id != a["digest"]:
                raise ManifestError(
                    f"image {ref}: its id is {image_id}, the manifest records "
                    f"{a['digest']}: not this release's image; do not run it"
                )
            if labels.get(LABEL) != a["inputs_digest"]:
                raise ManifestError(
                    f"image {ref}: its label {LABEL} is {labels.get(LABEL)}, the "
                    f"manifest records {a['inputs_digest']}; do not run it"
                )
            print(f"image {ref}: id {image_id} and inputs label match the manifest", flush=True)
            checked.append(ref)
    return checked, not_checked
