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


#: The spellings of a key Celery looks up, per configuration object and key (and the
#: object itself, so a new one with a recycled ``id`` is not taken for it).
_SPELLINGS: dict[tuple[int, str], tuple[Any, tuple[Any, ...]]] = {}


def setting(app: Any, key: str, default: Any = None) -> Any:
    """``app.conf.get(key, default)``: the same names in the same maps, in the same order."""
    conf = app.conf
    known = _SPELLINGS.get((id(conf), key))
    if known is None or known[0] is not conf:
        if not isinstance(conf, ConfigurationView):  # not loaded yet: its own get loads it
            return conf.get(key, default)
        known = _SPELLINGS[id(conf), key] = (
            conf, tuple(dict.fromkeys(conf._key(k) for k in conf._to_keys(key))))
    names = known[1]
    for mapping in conf.maps:
        if type(mapping) not in _PLAIN:  # still loading: its own get
            return conf.get(key, default)
        for name in names:
            if name in mapping:
                return mapping[name]
    return default
