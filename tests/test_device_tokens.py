"""Per-device tokens: signed, bound to the Device-Id (and Client-Id), expiring; admission rules."""

from __future__ import annotations

import os
import stat

import pytest

from gateway.config import AuthConfig, ConfigError
from gateway.security.device_tokens import Admission, DeviceAuth, DeviceTokenSigner, load_secret
from gateway.xiaozhi import HandshakeInfo

MAC = "d8:3b:da:4e:12:34"
OTHER = "d8:3b:da:4e:99:99"
UUID = "3f0c9a52-7a1e-4c1b-9d55-0d3b2a1f6e77"
SECRET = b"0123456789abcdef0123456789abcdef"
NOW = 1_700_000_000.0


def signer(ttl_s: float = 3600, secret: bytes = SECRET) -> DeviceTokenSigner:
    return DeviceTokenSigner(secret, ttl_s)


def test_a_token_opens_only_its_own_device():
    token = signer().issue(MAC, now=NOW)
    assert signer().verify(token, MAC, now=NOW + 10)
    assert signer().verify(token, MAC, "any-client", now=NOW + 10)  # issued without a Client-Id
    assert not signer().verify(token, OTHER, now=NOW + 10)
    assert not signer().verify(token, None, now=NOW + 10)
    assert not signer(secret=b"another-secret-of-enough-length!").verify(token, MAC, now=NOW + 10)


def test_a_token_issued_with_a_client_id_is_bound_to_it():
    token = signer().issue(MAC, UUID, now=NOW)
    assert signer().verify(token, MAC, UUID, now=NOW)
    assert not signer().verify(token, MAC, None, now=NOW)
    assert not signer().verify(token, MAC, "other-client", now=NOW)


def test_a_token_expires():
    token = signer(ttl_s=60).issue(MAC, now=NOW)
    assert signer().verify(token, MAC, now=NOW + 59)
    assert not signer().verify(token, MAC, now=NOW + 60)


def test_a_token_cannot_be_extended_or_rescoped():
    prefix, expiry, scope, sig = signer(ttl_s=60).issue(MAC, UUID, now=NOW).split(".")
    longer = ".".join((prefix, str(int(expiry) + 86400), scope, sig))
    unbound = ".".join((prefix, expiry, "d", sig))
    assert not signer().verify(longer, MAC, UUID, now=NOW)
    assert not signer().verify(unbound, MAC, UUID, now=NOW)


@pytest.mark.parametrize(
    "token",
    [
        "",
        "xzd1",
        "xzd1...",
        "xzd1.x.d.abc",
        "xzd1.9999999999999999.d.abc",
        "xzd1.1.dc.é",
        "a.b.c.d.e",
        "令牌",
    ],
)
def test_garbage_tokens_are_refused_without_error(token):
    assert not signer().verify(token, MAC, UUID, now=NOW)


def auth(**kw) -> AuthConfig:
    return AuthConfig(enabled=True, secret="s" * 32, **kw)


def info(
    device_id: str | None = MAC, token: str | None = None, client_id: str | None = UUID
) -> HandshakeInfo:
    return HandshakeInfo(device_id=device_id, client_id=client_id, token=token, protocol_version=1)


def test_auth_off_issues_nothing_and_admits_everyone():
    device_auth = DeviceAuth.from_config(AuthConfig(tokens=["op"], allowed_devices=[MAC]))
    assert device_auth.token_for(MAC, UUID) == ""
    assert device_auth.check(info()) is Admission.IDENTIFIED


def test_only_admitted_devices_get_a_token_and_never_the_static_one():
    closed = DeviceAuth.from_config(auth(tokens=["operator-secret"]))
    assert closed.token_for(MAC, UUID) == ""
    listed = DeviceAuth.from_config(auth(tokens=["operator-secret"], allowed_devices=[MAC]))
    token = listed.token_for(MAC, UUID)
    assert token and "operator-secret" not in token
    assert listed.token_for(OTHER, UUID) == ""
    assert listed.token_for(None, UUID) == ""
    opened = DeviceAuth.from_config(auth(ota_open=True))
    assert opened.token_for(OTHER, None)


def test_admission_verdicts():
    device_auth = DeviceAuth.from_config(auth(tokens=["operator-secret", "другой"], ota_open=True))
    token = device_auth.token_for(MAC, UUID)
    assert device_auth.check(info(token=token)) is Admission.AUTHENTICATED
    assert device_auth.check(info(token="operator-secret", device_id=None)) is Admission.AUTHENTICATED
    assert device_auth.check(info(token="другой")) is Admission.AUTHENTICATED  # non-ASCII compares safely
    assert device_auth.check(info(token=token, device_id=OTHER)) is Admission.REFUSED
    assert device_auth.check(info(token=token, client_id="other")) is Admission.REFUSED
    assert device_auth.check(info(token=None)) is Admission.REFUSED


def test_allow_listed_id_without_token_is_identified_not_authenticated():
    device_auth = DeviceAuth.from_config(auth(allowed_devices=[MAC]))
    assert device_auth.check(info(token=None)) is Admission.IDENTIFIED
    assert device_auth.check(info(token=device_auth.token_for(MAC, UUID))) is Admission.AUTHENTICATED


def test_a_device_token_stops_working_when_the_device_is_removed_from_the_list():
    token = DeviceAuth.from_config(auth(allowed_devices=[MAC])).token_for(MAC, UUID)
    after = DeviceAuth.from_config(auth(allowed_devices=[OTHER]))
    assert after.check(info(token=token)) is Admission.REFUSED


def test_without_a_configured_secret_tokens_do_not_survive_a_restart():
    config = AuthConfig(enabled=True, allowed_devices=[MAC])
    token = DeviceAuth.from_config(config).token_for(MAC, UUID)
    assert (
        DeviceAuth.from_config(config).check(info(token=token)) is Admission.IDENTIFIED
    )  # not AUTHENTICATED


def test_secret_file_is_created_private_and_reused(tmp_path):
    path = tmp_path / "device-token.secret"
    config = AuthConfig(enabled=True, allowed_devices=[MAC], secret_file=str(path))
    token = DeviceAuth.from_config(config).token_for(MAC, UUID)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert DeviceAuth.from_config(config).check(info(token=token)) is Admission.AUTHENTICATED
    assert load_secret(config)[1] == f"file {path}"


def test_a_bad_secret_file_is_a_config_error(tmp_path):
    path = tmp_path / "short"
    path.write_text("abc\n")
    with pytest.raises(ConfigError, match="secret_file"):
        DeviceAuth.from_config(AuthConfig(enabled=True, secret_file=str(path)))
    with pytest.raises(ConfigError, match="secret_file"):
        DeviceAuth.from_config(AuthConfig(enabled=True, secret_file=str(tmp_path / "no" / "such" / "dir")))
