"""Kafka's config providers, resolved by the worker: connector configs name their secrets
(``${file:/run/secrets/db.properties:password}``, ``${env:DB_PASSWORD}``) and the worker puts
the values in when it starts an instance, so the secrets never reach the coordinator, its log,
its store or a describe answer (docs/security.md, "Connector secrets").

Providers (Kafka's built-in ones, enabled with ``connect-worker run --config-providers``)::

    ${file:PATH:KEY}        KEY of the Java .properties file PATH (FileConfigProvider)
    ${directory:DIR:NAME}   the content of the file NAME in DIR (DirectoryConfigProvider)
    ${env:NAME}             the environment variable NAME (EnvVarConfigProvider)

As Kafka's ConfigTransformer: a reference to a provider that is not enabled is left as it is;
one an enabled provider cannot resolve (no such file, key or variable) is an error naming the
reference, never its value. With ``allowed_paths`` (Kafka's ``allowed.paths``), files outside
those directories are refused: without it, whoever may write a connector config may read any
file the worker can.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from connect_wire.client_security import parse_properties

__all__ = ["PROVIDERS", "ConfigProviderError", "ConfigProviders"]

PROVIDERS = ("file", "directory", "env")
# Kafka's ConfigTransformer.DEFAULT_PATTERN: ${provider:[path:]key}
_PATTERN = re.compile(r"\$\{([^}]*?):(([^}]*?):)?([^}]*?)\}")


class ConfigProviderError(ValueError):
    """A reference an enabled provider cannot resolve (the message names it, not a value)."""


class ConfigProviders:
    def __init__(self, enabled: Iterable[str], allowed_paths: Iterable[str] = (),
                 environ: Mapping[str, str] | None = None) -> None:
        self.enabled = frozenset(p.strip() for p in enabled if p.strip())
        unknown = sorted(self.enabled - set(PROVIDERS))
        if unknown:
            raise ValueError(f"unknown config provider {', '.join(unknown)} (one of "
                             f"{', '.join(PROVIDERS)})")
        self.allowed = [Path(p).resolve() for p in allowed_paths if p.strip()]
        self.environ = os.environ if environ is None else environ

    def resolve(self, config: Mapping[str, str | None]) -> dict[str, str | None]:
        """``config`` with every reference to an enabled provider replaced by its value."""
        if not self.enabled:
            return dict(config)
        out: dict[str, str | None] = {}
        for name, value in config.items():
            out[name] = value if value is None or "${" not in value else _PATTERN.sub(
                lambda m, name=name: self._lookup(name, m), value)  # type: ignore[misc]
        return out

    def _lookup(self, name: str, m: re.Match[str]) -> str:
        provider, path, key = m.group(1), m.group(3), m.group(4)
        if provider not in self.enabled:
            return m.group(0)
        where = f"{name}: {m.group(0)}"
        if provider == "env":
            value = self.environ.get(key)
            if value is None:
                raise ConfigProviderError(f"{where}: no environment variable {key}")
            return value
        if not path:
            raise ConfigProviderError(f"{where}: the {provider} provider needs a path")
        if provider == "directory":
            target = Path(path) / key
            if Path(key).name != key:
                raise ConfigProviderError(f"{where}: {key!r} is not a file name in {path}")
        else:
            target = Path(path)
        target = self._allowed(where, target)
        try:
            text = target.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigProviderError(f"{where}: cannot read {target}: "
                                      f"{getattr(exc, 'strerror', None) or exc}") from None
        if provider == "directory":
            return text
        values = parse_properties(text)
        if key not in values:
            raise ConfigProviderError(f"{where}: no key {key} in {target}")
        return values[key]

    def _allowed(self, where: str, target: Path) -> Path:
        resolved = target.resolve()
        if self.allowed and not any(resolved.is_relative_to(a) for a in self.allowed):
            raise ConfigProviderError(f"{where}: {target} is outside the allowed paths "
                                      f"({', '.join(str(a) for a in self.allowed)})")
        return resolved
