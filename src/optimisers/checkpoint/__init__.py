"""Checkpoints: ``save`` and ``load`` a state tree, without pickle.

A checkpoint is a ZIP file of stored members (``numpy.load`` and ``unzip`` read it): array
``i`` as ``arrays/<i>.npy`` (a dtype NumPy lacks, ``bfloat16``, as the unsigned integers of
its bits), and ``checkpoint.json``: ``{"format": "optimisers.checkpoint", "version": 2,
"nodes": [...], "leaves": [...], "arrays": <count>}``. ``nodes`` is the state tree flat,
parents first, each node referenced once: ``null``, ``{"leaf": i}`` (a tied Leaf stored
once), ``{"dict": [[<key>, n], ...]}``, ``{"tuple"|"list": [n, ...]}`` (version 1 nested
them in ``"tree"``). A leaf is ``{"path": "layers.0.weight", "rule": <value>, "frozen":
false, "clock": 3, "state": <value>}``. A value is ``null``, a bool, an integer, a string,
or a tag: ``{"float": "0.9"}`` (its ``repr``), ``{"complex": [re, im]}``, ``{"tuple"|"list":
[...]}``, ``{"dict": [[k, v], ...]}``, ``{"array": i, "dtype": "float32", "shape": [3],
"library": "torch"}`` (and ``"bits"``, ``"scalar"``, ``"weak"``), ``{"rule"|"schedule":
"Adam", "fields": {...}}`` (by name in ``RULES`` or ``SCHEDULES``), ``{"function":
"module:name"}``, ``{"dtype": "float32", "as": "numpy"|"type"|"torch"|"jax"}``; at most 100
deep.

A file is untrusted: loading never unpickles, runs or imports what it names (rules from
the registries, functions from ``like``, dtypes from libraries already imported), builds
rules only after the whole file matched ``like``, reads regular files only, and refuses
compressed members, names used twice, members larger than their records, and a
``checkpoint.json`` over 4 times what ``like``'s own takes plus 1 MiB.
"""

from optimisers.checkpoint.io import load, save
from optimisers.checkpoint.statedict import load_state_dict, state_dict

__all__ = ["save", "load", "state_dict", "load_state_dict"]
