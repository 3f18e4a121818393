"""The app's settings read on a message's path, at the cost of a present key.

``app.conf.get`` of a key the app does not set raises and catches a ``KeyError`` per
mapping and per spelling of the name (prefix, old-style name): 5 µs of CPU here, on
every delivery for each optional setting of ours. ``setting`` makes the same lookup
with ``in``.
"""

from __future__ import annotations

from typing import Any

from celery.utils.collections import ConfigurationView, DictAttribute

#: Maps whose ``in`` answers as their ``[]`` does (not Celery's pending configuration).
_PLAIN = (dict, DictAttribute)


def setting(app: Any, key: str, default: Any = None) -> Any:
    """``app.conf.get(key, default)``: the same names in the same maps, in the same order."""
    conf = app.conf
    if not isinstance(conf, ConfigurationView) or \
            not all(type(m) in _PLAIN for m in conf.maps):  # still loading: its own get
        return conf.get(key, default)
    keys = [conf._key(k) for k in conf._to_keys(key)]
    for mapping in conf.maps:
        for name in keys:
            if name in mapping:
                return mapping[name]
    return default
