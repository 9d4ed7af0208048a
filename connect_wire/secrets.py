"""Which connector config values are secrets, and how they are hidden from those who may only
look (docs/security.md, "Connector secrets").

Kafka Connect marks a plugin's secret settings with the ConfigDef type PASSWORD and shows them
as ``[hidden]``; plugins here declare nothing, so a key is taken as secret by its name, as
Kafka's own Password settings are named: one containing ``password``, ``secret``, ``token``,
``credential``, ``jaas`` or ending in ``.key`` / ``apikey`` / ``api.key`` (``ssl.key.password``,
``sasl.jaas.config``, ``aws.secret.access.key``, ``api.key``). A value that is only a config
provider reference (``${file:/path:key}``) names where the secret is, not the secret: shown.
"""

from __future__ import annotations

import re

__all__ = ["HIDDEN", "hide", "is_secret_key"]

HIDDEN = "[hidden]"
"""What a hidden value reads (Kafka Connect's REST API writes the same)."""

_SECRET = re.compile(r"password|secret|token|credential|jaas|(^|[._-])(api[._-]?)?key$",
                     re.IGNORECASE)
_REFERENCE = re.compile(r"\$\{[^}]*\}")


def is_secret_key(name: str) -> bool:
    """Whether the config key ``name`` holds a secret, by its name."""
    return _SECRET.search(name) is not None


def hide(name: str, value: str | None) -> str | None:
    """``value``, or :data:`HIDDEN` when ``name`` is secret and the value is not just a config
    provider reference."""
    if value is None or not is_secret_key(name) or _REFERENCE.fullmatch(value.strip()):
        return value
    return HIDDEN
