"""The release key: a key the pipeline makes is private from its first
instant, a key readable by others is refused as ssh refuses it, an encrypted
key opens with its passphrase (environment or terminal) and fails clearly
without, and the fingerprint operators pin is the one documented."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import stat

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pipeline import release_format, signing
from pipeline.errors import SigningKeyError
from pipeline.signing import PASSPHRASE_ENV
from pipeline.stages import manifest


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def write_key(path, key=None, *, passphrase: bytes | None = None, perms: int = 0o600):
    key = key or Ed25519PrivateKey.generate()
    encryption = serialization.BestAvailableEncryption(passphrase) if passphrase else serialization.NoEncryption()
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    path.chmod(perms)
    return key


# --- a key the pipeline makes -----------------------------------------------------


def test_a_generated_key_is_0600_in_a_0700_folder_even_with_umask_0(tmp_path):
    old = os.umask(0)
    try:
        path = tmp_path / "cache" / "signing" / "key.pem"
        key = signing.generate_key(path)
    finally:
        os.umask(old)
    assert mode(path) == 0o600 and mode(path.parent) == 0o700
    assert signing.fingerprint(signing.load_private_key(path)) == signing.fingerprint(key)


def test_a_generated_key_is_created_exclusively_with_mode_0600_never_widened(tmp_path, monkeypatch):
    """The file is born 0600 by the open that creates it (O_CREAT|O_EXCL),
    not written first and narrowed after: no instant when others can read it."""
    opened, chmods = [], []
    real_open, real_chmod = os.open, os.chmod

    def spy_open(path, flags, mode=0o777, *args, **kw):
        opened.append((os.fspath(path), flags, mode))
        return real_open(path, flags, mode, *args, **kw)

    def spy_chmod(path, mode, *args, **kw):
        chmods.append((os.fspath(path), mode))
        return real_chmod(path, mode, *args, **kw)

    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "chmod", spy_chmod)
    path = tmp_path / "key.pem"
    signing.generate_key(path)
    ((flags, created_mode),) = [(f, m) for p, f, m in opened if p == str(path)]
    assert flags & os.O_CREAT and flags & os.O_EXCL and created_mode == 0o600
    assert all(m & 0o077 == 0 for p, m in chmods if p == str(path))


def test_a_generated_key_never_replaces_a_file_or_follows_a_link(tmp_path):
    existing = tmp_path / "key.pem"
    existing.write_text("someone's key\n")
    with pytest.raises(SigningKeyError, match=f"{existing}: exists; a new key is never written over it"):
        signing.generate_key(existing)
    assert existing.read_text() == "someone's key\n"
    link = tmp_path / "link.pem"
    link.symlink_to(tmp_path / "elsewhere.pem")
    with pytest.raises(SigningKeyError, match="exists"):
        signing.generate_key(link)
    assert not (tmp_path / "elsewhere.pem").exists()


# --- a key the user gives -----------------------------------------------------------


@pytest.mark.parametrize("perms", [0o644, 0o640, 0o604, 0o660, 0o606, 0o700 | 0o044])
def test_a_private_key_others_can_access_is_refused_as_ssh_does(tmp_path, perms):
    path = tmp_path / "key.pem"
    write_key(path, perms=perms)
    with pytest.raises(SigningKeyError) as err:
        signing.load_private_key(path)
    assert f"permissions {perms:04o} for '{path}' are too open" in str(err.value)
    assert f"chmod 600 {path}" in str(err.value)


@pytest.mark.parametrize("perms", [0o600, 0o400])
def test_a_private_key_only_its_owner_can_read_is_accepted(tmp_path, perms):
    path = tmp_path / "key.pem"
    key = write_key(path, perms=perms)
    assert signing.fingerprint(signing.load_private_key(path)) == signing.fingerprint(key)


def test_an_encrypted_key_opens_with_the_passphrase_from_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "key.pem"
    key = write_key(path, passphrase=b"correct horse")
    monkeypatch.setenv(PASSPHRASE_ENV, "correct horse")
    assert signing.fingerprint(signing.signing_key(str(path))) == signing.fingerprint(key)


def test_an_encrypted_key_asks_for_its_passphrase_on_a_terminal(tmp_path, monkeypatch):
    path = tmp_path / "key.pem"
    key = write_key(path, passphrase=b"correct horse")
    monkeypatch.delenv(PASSPHRASE_ENV, raising=False)
    tty = io.StringIO()
    tty.isatty = lambda: True
    monkeypatch.setattr("sys.stdin", tty)
    asked = []
    monkeypatch.setattr("getpass.getpass", lambda prompt: asked.append(prompt) or "correct horse")
    assert signing.fingerprint(signing.load_private_key(path)) == signing.fingerprint(key)
    assert asked == [f"passphrase for {path}: "]


def test_an_encrypted_key_without_a_passphrase_or_terminal_is_refused_naming_the_variable(tmp_path, monkeypatch):
    path = tmp_path / "key.pem"
    write_key(path, passphrase=b"correct horse")
    monkeypatch.delenv(PASSPHRASE_ENV, raising=False)
    monkeypatch.setattr("sys.stdin", io.StringIO())
    with pytest.raises(
        SigningKeyError, match=f"{path}: the key is encrypted and no passphrase was given; set {PASSPHRASE_ENV}"
    ):
        signing.signing_key(str(path))


def test_a_wrong_passphrase_is_refused_naming_where_it_came_from(tmp_path, monkeypatch):
    path = tmp_path / "key.pem"
    write_key(path, passphrase=b"correct horse")
    monkeypatch.setenv(PASSPHRASE_ENV, "battery staple")
    with pytest.raises(SigningKeyError, match=f"{path}: {PASSPHRASE_ENV} does not open this key"):
        signing.load_private_key(path)


@pytest.mark.parametrize("case", ["missing", "folder", "not PEM", "not Ed25519"])
def test_a_key_that_cannot_be_used_is_refused_naming_it_and_what_to_do(tmp_path, case):
    path = tmp_path / "key.pem"
    if case == "folder":
        path.mkdir()
    elif case == "not PEM":
        path.write_text("hello\n")
        path.chmod(0o600)
    elif case == "not Ed25519":
        write_key(path, ec.generate_private_key(ec.SECP256R1()))
    with pytest.raises(SigningKeyError) as err:
        signing.load_private_key(path)
    assert str(err.value).startswith(f"{path}: ")
    assert {
        "missing": "no such file",
        "folder": "a folder",
        "not PEM": "not a PEM private key",
        "not Ed25519": "not Ed25519",
    }[case] in str(err.value)


# --- the fingerprint ------------------------------------------------------------------


def test_the_fingerprint_is_sha256_of_the_raw_public_key_in_base64_as_documented(tmp_path):
    key = Ed25519PrivateKey.generate()
    # What an operator computes with openssl: the SPKI DER's last 32 bytes
    # are the raw key (see pipeline/signing.py).
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    expected = "SHA256:" + base64.b64encode(hashlib.sha256(der[-32:]).digest()).decode().rstrip("=")
    assert signing.fingerprint(key) == signing.fingerprint(key.public_key()) == expected
    assert re.fullmatch(r"SHA256:[A-Za-z0-9+/]{43}", expected)
    assert signing.parse_fingerprint(f" {expected}=\n") == expected
    with pytest.raises(SigningKeyError, match="--fingerprint: 'SHA256:abc' is not a key fingerprint"):
        signing.parse_fingerprint("SHA256:abc")


def test_the_manifest_stage_writes_the_fingerprint_to_pin_beside_its_output(tmp_path):
    from tests.unit.test_manifest import small_manifest

    key = signing.generate_key(tmp_path / "signing" / "key.pem")
    path, _, pub = manifest.write_signed(small_manifest(tmp_path), tmp_path / "out", key)
    assert (path.parent / release_format.FINGERPRINT_FILE).read_text() == signing.fingerprint(key) + "\n"
    assert signing.fingerprint(signing.load_public_key(pub, what="key")) == signing.fingerprint(key)
