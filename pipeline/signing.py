"""The release key: an Ed25519 key that signs the manifest, and the
fingerprint operators pin to check it.

- A private key is read as ssh reads one: a file that gives its group or
  others any access is refused; an encrypted key is opened with the
  passphrase in ACTIVEKV_SIGNING_KEY_PASSPHRASE, else one asked for on the
  terminal, else refused with a message naming that variable.
- The pipeline's own local key is created with O_CREAT|O_EXCL and mode 0600
  in a 0700 folder: it is never readable by others, not even for an instant,
  and never overwrites a key that is there.
- The fingerprint is `SHA256:` followed by the base64 (no padding, as ssh
  prints fingerprints) of the sha256 of the raw 32-byte Ed25519 public key.
  It is not ssh-keygen's figure for the same key (ssh hashes its own wire
  format); compute it from a PEM public key with:
      openssl pkey -pubin -in KEY.pub.pem -outform DER | tail -c 32 \\
        | openssl dgst -sha256 -binary | base64 | tr -d =
"""

from __future__ import annotations

import base64
import binascii
import getpass
import hashlib
import os
import re
import shlex
import stat
import sys
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from pipeline.errors import SigningKeyError
from pipeline.paths import SIGNING_KEY, relative

PASSPHRASE_ENV = "ACTIVEKV_SIGNING_KEY_PASSPHRASE"
MAKE_KEY = "openssl genpkey -algorithm ed25519 -out key.pem && chmod 600 key.pem"
_FINGERPRINT = re.compile(r"SHA256:([A-Za-z0-9+/]{43})=?")


def fingerprint(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """`SHA256:<base64, no padding>` of the sha256 of the raw public key."""
    if isinstance(key, Ed25519PrivateKey):
        key = key.public_key()
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "SHA256:" + base64.b64encode(hashlib.sha256(raw).digest()).decode().rstrip("=")


def parse_fingerprint(text: str, *, what: str = "--fingerprint") -> str:
    """The fingerprint `text` in its canonical form (no padding); raises
    SigningKeyError naming `what` when it is not one."""
    match = _FINGERPRINT.fullmatch(text.strip())
    if match is None:
        raise SigningKeyError(
            f"{what}: {text.strip()!r} is not a key fingerprint; it reads "
            f"SHA256: then 43 base64 characters, as the release printed it"
        )
    return "SHA256:" + match.group(1)


def _read_private(path: Path) -> bytes:
    """The key file's bytes, refused (as ssh does) when group or others have
    any access to it. The mode is read from the open file, not the name."""
    try:
        with path.open("rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise SigningKeyError(
                    f"{path}: not a file; give an Ed25519 private key (PEM), made e.g. with: {MAKE_KEY}"
                )
            if mode & 0o077:
                raise SigningKeyError(
                    f"permissions {stat.S_IMODE(mode):04o} for '{path}' are too "
                    f"open: others may read the release key; "
                    f"chmod 600 {shlex.quote(str(path))}"
                )
            return f.read()
    except FileNotFoundError:
        raise SigningKeyError(
            f"{path}: no such file; give an Ed25519 private key (PEM) with --key or "
            f"ACTIVEKV_SIGNING_KEY, made e.g. with: {MAKE_KEY}"
        ) from None
    except IsADirectoryError:
        raise SigningKeyError(f"{path}: a folder, not a key file; give the PEM file itself") from None
    except OSError as e:
        raise SigningKeyError(f"{path}: cannot be read ({e.strerror}); give a key file you can read") from None


def _passphrase(path: Path) -> bytes:
    given = os.environ.get(PASSPHRASE_ENV)
    if given is not None:
        return given.encode()
    if sys.stdin is not None and sys.stdin.isatty():
        return getpass.getpass(f"passphrase for {path}: ").encode()
    raise SigningKeyError(
        f"{path}: the key is encrypted and no passphrase was given; set "
        f"{PASSPHRASE_ENV} (there is no terminal to ask on)"
    )


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """The Ed25519 private key in `path` (PEM), asking for its passphrase
    where it has one."""
    data = _read_private(path)
    try:
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except TypeError:  # encrypted: it needs a passphrase
            try:
                key = serialization.load_pem_private_key(data, password=_passphrase(path))
            except ValueError:
                source = PASSPHRASE_ENV if PASSPHRASE_ENV in os.environ else "the passphrase given"
                raise SigningKeyError(f"{path}: {source} does not open this key; give its passphrase") from None
    except ValueError as e:
        raise SigningKeyError(f"{path}: not a PEM private key ({e}); make an Ed25519 key with: {MAKE_KEY}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(
            f"{path}: a {type(key).__name__.removeprefix('_')} key, not Ed25519; make one with: {MAKE_KEY}"
        )
    return key


def generate_key(path: Path) -> Ed25519PrivateKey:
    """A new key written to `path`, which must not exist. The file is created
    0600 (O_EXCL: never over another file or a link) in a folder made 0700."""
    if not path.parent.is_dir():
        path.parent.mkdir(mode=0o700, parents=True)
        path.parent.chmod(0o700)  # mkdir's mode passes through the umask
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise SigningKeyError(
            f"{path}: exists; a new key is never written over it (load it, or move it away to make a new one)"
        ) from None
    try:
        os.fchmod(fd, 0o600)  # exactly 0600, whatever the umask took away
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return key


def public_pem(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def load_public_key(path: Path, *, what: str) -> Ed25519PublicKey:
    """The Ed25519 public key (PEM) in `path`; `what` names it in errors
    (e.g. "--trusted-key")."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SigningKeyError(f"{what} {path}: no such file") from None
    except IsADirectoryError:
        raise SigningKeyError(f"{what} {path}: a folder, not a key file; give the PEM file itself") from None
    except OSError as e:
        raise SigningKeyError(f"{what} {path}: cannot be read ({e.strerror})") from None
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, binascii.Error) as e:
        raise SigningKeyError(f"{what} {path}: not a PEM public key ({e})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise SigningKeyError(f"{what} {path}: not an Ed25519 public key")
    return key


def signing_key(path: str | None) -> Ed25519PrivateKey:
    """The user's Ed25519 key (--key or ACTIVEKV_SIGNING_KEY; its passphrase
    from ACTIVEKV_SIGNING_KEY_PASSPHRASE or the terminal), else a local key
    made once for this checkout (fine for local destinations only)."""
    given = path or os.environ.get("ACTIVEKV_SIGNING_KEY")
    if given:
        return load_private_key(Path(given))
    if SIGNING_KEY.is_file():
        return load_private_key(SIGNING_KEY)
    print(
        f"note: no signing key given (--key or ACTIVEKV_SIGNING_KEY); made a local one at "
        f"{relative(SIGNING_KEY)}. Use your own key for any shared destination.",
        flush=True,
    )
    return generate_key(SIGNING_KEY)


def key_in_use(path: str | None) -> tuple[str, str]:
    """Which key the manifest stage will sign with, said before a release
    runs: (where it is and who chose it, its identity: the fingerprint).
    The same choice as signing_key's, without making or asking anything: a
    given key that cannot be used (missing, too open, not Ed25519) is refused
    here, before any stage; an encrypted key is opened only where its
    passphrase is in ACTIVEKV_SIGNING_KEY_PASSPHRASE (the manifest stage asks
    on the terminal otherwise); the local key not made yet has no identity."""
    given = path or os.environ.get("ACTIVEKV_SIGNING_KEY")
    if given:
        where = f"{given} ({'--key' if path else 'ACTIVEKV_SIGNING_KEY'})"
        if b"ENCRYPTED" in _read_private(Path(given)) and PASSPHRASE_ENV not in os.environ:
            return where, "encrypted: its passphrase is asked for at the manifest stage"
        return where, fingerprint(load_private_key(Path(given)))
    where = f"{relative(SIGNING_KEY)} (this checkout's local key: local destinations only)"
    if SIGNING_KEY.is_file():
        return where, fingerprint(load_private_key(SIGNING_KEY))
    return where, "none yet: the manifest stage makes it"
