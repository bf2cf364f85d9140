"""Which ``slurm.conf`` a Slurm command reads, and the environment distlab runs each one with (pure:
it looks at the environment and at whether files exist, and starts nothing).

Where neither ``SLURM_CONF`` nor a default file exists, a Slurm client asks the site's DNS for
``_slurmctld._tcp`` (configless mode) and would submit wherever that record points: :func:`client_env`
refuses instead, so no command distlab runs ever falls back to DNS.
"""
from __future__ import annotations

import os

from .errors import NO_CONFIG, SlurmNotFoundError

#: Slurm's own default (Debian's build) and the copy a configless node keeps: what a client reads without SLURM_CONF
DEFAULT_CONFS = ("/etc/slurm/slurm.conf", "/run/slurm/conf/slurm.conf")


def config_file(environ=None) -> str | None:
    """The slurm.conf a Slurm command would read; None where it would ask DNS (none exists) or retry
    for a minute (``SLURM_CONF`` names a missing file)."""
    environ = os.environ if environ is None else environ
    named = environ.get("SLURM_CONF")
    if named:
        return named if os.path.isfile(named) else None
    return next((path for path in DEFAULT_CONFS if os.path.isfile(path)), None)


def client_env(environ=None) -> dict[str, str]:
    """``environ`` (``os.environ``) with ``SLURM_CONF`` set to the file found: a Slurm command distlab
    runs never falls back to DNS. Raises :class:`SlurmNotFoundError` (:data:`NO_CONFIG`) where none exists."""
    environ = os.environ if environ is None else environ
    conf = config_file(environ)
    if conf is None:
        raise SlurmNotFoundError(NO_CONFIG.format(conf=environ.get("SLURM_CONF"), defaults=" and ".join(DEFAULT_CONFS)))
    return {**environ, "SLURM_CONF": conf}
