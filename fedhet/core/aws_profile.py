"""The user's AWS profile, read as the AWS CLI reads it, for what the environment leaves unset.

obstore reads the environment's AWS_* variables but no profile. The profile is AWS_PROFILE (else
AWS_DEFAULT_PROFILE, else `default`); its keys come from the credentials file
(AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials, section `[NAME]`), else from the config
file (AWS_CONFIG_FILE, else ~/.aws/config, section `[profile NAME]`, or `[default]`), which also
gives `region` and `endpoint_url` (the profile's own, or the `s3` one of its `services`
section). The environment wins over the profile, setting by setting: the keys (both, or the
session token with them), the region (AWS_REGION, AWS_DEFAULT_REGION) and the endpoint
(AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL).
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Mapping
from pathlib import Path

from fedhet.core.errors import InputError

KEYS = ("aws_access_key_id", "aws_secret_access_key")
# a profile whose keys come from elsewhere, which fedhet does not read
INDIRECT = ("sso_session", "sso_start_url", "credential_process", "role_arn", "source_profile")
REGION_VARIABLES = ("AWS_REGION", "AWS_DEFAULT_REGION")
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


def _file(variable: str, default: str, environ: Mapping[str, str]) -> Path:
    home = Path(environ["HOME"]) if environ.get("HOME") else Path.home()
    return Path(environ.get(variable) or home / ".aws" / default).expanduser()


def _read(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except configparser.Error as error:
        raise InputError(f"{path}: unreadable ({error.message.splitlines()[0]})") from None
    return parser


def _section(parser: configparser.ConfigParser, *names: str) -> dict[str, str] | None:
    for name in names:
        if parser.has_section(name):
            return dict(parser.items(name))
    return None


def _services_endpoint(config: configparser.ConfigParser, profile: dict[str, str]) -> str | None:
    """The `endpoint_url` under `s3 =` in the profile's `[services NAME]` section, if any."""
    services = _section(config, f"services {profile.get('services', '')}") or {}
    nested = configparser.ConfigParser(interpolation=None)
    nested.read_string("[s3]\n" + services.get("s3", ""))
    return nested.get("s3", "endpoint_url", fallback=None)


def settings(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """obstore's settings (access_key_id, secret_access_key, session_token, region, endpoint)
    that the profile gives and the environment does not; InputError for a profile asked for by
    name that neither file has, or one whose keys fedhet cannot read (SSO, a process, a role)."""
    name = environ.get("AWS_PROFILE") or environ.get("AWS_DEFAULT_PROFILE") or "default"
    credentials_file = _file("AWS_SHARED_CREDENTIALS_FILE", "credentials", environ)
    config_file = _file("AWS_CONFIG_FILE", "config", environ)
    config = _read(config_file)
    keyed = _section(_read(credentials_file), name)
    configured = _section(config, f"profile {name}", *(["default"] if name == "default" else []))
    if keyed is None and configured is None:
        if name == "default":
            return {}
        raise InputError(
            f"AWS_PROFILE={name}: no such profile in {credentials_file} or {config_file}; "
            "fix the name or unset AWS_PROFILE"
        )
    found: dict[str, str] = {}
    if not any(environ.get(key.upper()) for key in KEYS):
        found |= _keys(name, keyed or {}, configured or {})
    if not any(environ.get(variable) for variable in REGION_VARIABLES):
        region = (configured or {}).get("region")
        found |= {"region": region} if region else {}
    if not any(environ.get(variable) for variable in ENDPOINT_VARIABLES) and configured:
        endpoint = _services_endpoint(config, configured) or configured.get("endpoint_url")
        found |= {"endpoint": endpoint} if endpoint else {}
    return found


def _keys(name: str, keyed: dict[str, str], configured: dict[str, str]) -> dict[str, str]:
    """The profile's keys: from the credentials file, else from the config file."""
    for section in (keyed, configured):
        if all(section.get(key) for key in KEYS):
            token = section.get("aws_session_token")
            return {
                "access_key_id": section["aws_access_key_id"],
                "secret_access_key": section["aws_secret_access_key"],
            } | ({"session_token": token} if token else {})
    indirect = [field for field in INDIRECT if field in keyed or field in configured]
    if indirect:
        raise InputError(
            f"AWS profile {name}: its keys come from {indirect[0]}, which fedhet does not read; "
            f"export them (`aws configure export-credentials --profile {name} --format env`)"
        )
    return {}
