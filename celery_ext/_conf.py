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


#: The spellings Celery looks a key up by, per naming (prefix, old-name translators, key
#: type) and key: a configuration's prefix is set when it loads (``config_from_object``
#: with a namespace), so the cache goes by the naming, never by the object.
_SPELLINGS: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def setting(app: Any, key: str, default: Any = None) -> Any:
    """``app.conf.get(key, default)``: the same names in the same maps, in the same order."""
    conf = app.conf
    if not isinstance(conf, ConfigurationView):  # not loaded yet: its own get loads it
        return conf.get(key, default)
    maps = conf.maps
    for mapping in maps:
        if type(mapping) not in _PLAIN:  # still loading: its own get
            return conf.get(key, default)
    naming = (conf.prefix, conf._keys, conf.key_t, key)
    names = _SPELLINGS.get(naming)
    if names is None:
        if len(_SPELLINGS) >= 1024:
            _SPELLINGS.clear()
        names = _SPELLINGS[naming] = tuple(dict.fromkeys(
            conf._key(k) for k in conf._to_keys(key)))
    for mapping in maps:
        for name in names:
            if name in mapping:
                return mapping[name]
    return default
