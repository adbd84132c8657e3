"""Moving a run between ``torch.optim`` and this library, mid-run: each param group becomes
the rule of the same formula, each tensor of a parameter's state is copied into its Leaf's,
and the count ``step`` becomes the Leaf's clock; the next steps are then the same on either
side, to rounding."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from optimisers.keypath import getkeypath
from optimisers.leaf import leaves
from optimisers.rules.adaptive import AdaGrad, Adam, AdamW, RMSProp
from optimisers.rules.base import Rule
from optimisers.rules.composite import OptimiserChain, chained
from optimisers.rules.descent import Descent, Momentum, Nesterov, WeightDecay
from optimisers.schedules import timed
from optimisers.state import setup

__all__ = ["from_torch", "to_torch"]

_ADAM = ("exp_avg", "exp_avg_sq", "step")
_NAMES = {Adam: _ADAM, AdamW: _ADAM, AdaGrad: "sum", RMSProp: ("square_avg", "grad_avg"),
         Momentum: "momentum_buffer", Nesterov: "momentum_buffer"}
"""Each stateful rule's state, item by item, as the keys of torch.optim's state of a tensor."""

_REFUSED = {"amsgrad": False, "maximize": False, "dampening": 0, "lr_decay": 0}
"""Options of a param group that no rule here computes, with the value each must have."""


def _adam(g: dict) -> tuple:
    if g["decoupled_weight_decay"]:  # (torch.optim.AdamW)
        return (AdamW(g["lr"], g["betas"], g["weight_decay"], g["eps"]),)
    return (Adam(g["lr"], g["betas"], g["eps"]),)


def _sgd(g: dict) -> tuple:
    if not g["momentum"]:
        return (Descent(g["lr"]),)
    return ((Nesterov if g["nesterov"] else Momentum)(g["lr"], g["momentum"], eta_outside=True),)


def _rmsprop(g: dict) -> tuple:
    if not g["momentum"]:  # torch: b = momentum*b + g/avg; x -= lr*b
        return (RMSProp(g["lr"], g["alpha"], g["eps"], g["centered"]),)
    return (RMSProp(1.0, g["alpha"], g["eps"], g["centered"]),
            Momentum(g["lr"], g["momentum"], eta_outside=True))


_RULES = {torch.optim.Adam: _adam, torch.optim.AdamW: _adam, torch.optim.SGD: _sgd,
         torch.optim.Adagrad: lambda g: (AdaGrad(g["lr"], g["eps"]),),
         torch.optim.RMSprop: _rmsprop}
"""Each torch.optim class (exactly: a subclass may compute otherwise) and the rules of one
of its param groups, without the weight decay that torch adds to the gradient."""


def _rule(kind: type, g: dict) -> Rule:
    """_rule(kind, g) -> the rule of the param group ``g`` of a ``kind`` optimiser."""
    if kind not in _RULES:
        raise TypeError(f"expected a torch.optim optimiser of the classes "
                        f"{', '.join(k.__name__ for k in _RULES)}, got {kind.__name__}")
    for option, value in _REFUSED.items():
        if g.get(option, value) != value:
            raise ValueError(f"{kind.__name__}'s {option}={g[option]!r} has no rule of the "
                             f"same formula here; only {option}={value!r} moves")
    rules = _RULES[kind](g)
    if g["weight_decay"] and not g.get("decoupled_weight_decay"):  # L2, on the gradient
        rules = (WeightDecay(g["weight_decay"]), *rules)
    return OptimiserChain(*rules) if len(rules) > 1 else rules[0]


def from_torch(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> Any:
    """from_torch(optimizer, model) -> tree: the state tree that goes on where ``optimizer``
    stands, for ``update_(tree, model)``.

    Each param group gives its tensors the rule of the same formula: ``Adam`` (with
    ``weight_decay``: ``OptimiserChain(WeightDecay(wd), Adam(...))``, the L2 decay
    torch adds to the gradient), ``AdamW``, ``SGD`` (``Descent``, or ``Momentum`` /
    ``Nesterov`` with ``eta_outside=True``, torch's form), ``Adagrad`` (``AdaGrad``) and
    ``RMSprop`` (``RMSProp``; with ``momentum``, ``OptimiserChain(RMSProp(1.0, ...),
    Momentum(lr, momentum, eta_outside=True))``). Each state tensor is copied, and
    ``step`` becomes the Leaf's clock (and Adam's count; SGD keeps none: 0). A scheduler is
    not carried: the group's current ``lr`` is the rule's ``eta``.

    Args:
        optimizer: a ``torch.optim.Adam``, ``AdamW``, ``SGD``, ``Adagrad`` or ``RMSprop``.
        model: the module whose parameters it trains; a parameter in no group, or with
            ``requires_grad=False`` (which torch.optim skips), is left out.

    Returns:
        The state tree, as ``setup`` makes it, with torch's states and step counts.

    Raises:
        TypeError: ``optimizer`` is of another class.
        ValueError: a group's option has no rule of its formula (``amsgrad``, ``maximize``,
            ``dampening``, ``lr_decay``), or a tensor of a group is not in ``model``.

    Example:
        >>> import torch
        >>> net = torch.nn.Linear(2, 1)
        >>> opt = torch.optim.SGD([{"params": [net.weight]},
        ...                        {"params": [net.bias], "weight_decay": 0.1}], 0.1, 0.9)
        >>> net(torch.ones(1, 2)).sum().backward()
        >>> opt.step()
        >>> tree = from_torch(opt, net)
        >>> tree["weight"].rule, tree["weight"].state.tolist()
        (Momentum(eta=0.1, rho=0.9, eta_outside=True), [[1.0, 1.0]])
        >>> tree["bias"].rule.rules[0]
        WeightDecay(lambd=0.1)
    """
    rules = {id(p): _rule(type(optimizer), g) for g in optimizer.param_groups
             for p in g["params"] if p.requires_grad}  # (one frozen since: no Leaf, as setup)
    seen: set[int] = set()
    tree = setup(lambda kp, x: seen.add(id(x)) or rules.get(id(x)), model)
    if missing := rules.keys() - seen:
        raise ValueError(f"{len(missing)} tensors of the optimiser's param groups are not "
                         f"trainable parameters of the model; pass the model it trains")
    for kp, leaf in leaves(tree):
        saved = optimizer.state.get(getkeypath(model, kp), {})
        leaf.state = chained(leaf.rule, leaf.state,
                             lambda r, s, saved=saved: _read(_NAMES.get(type(r)), s, saved))
        leaf.clock = int(saved.get("step", 0))
    return tree


def _read(names: Any, s: Any, saved: dict) -> Any:
    """The state ``s`` with each item that torch holds under its name in ``names``: a copy."""
    if isinstance(names, tuple):
        return tuple(_read(n, x, saved) for n, x in zip(names, s))
    v = saved.get(names) if names else None
    return s if v is None else float(v) if names == "step" else v.detach().clone()


def to_torch(tree: Any, model: torch.nn.Module) -> torch.optim.Optimizer:
    """to_torch(tree, model) -> optimizer: the ``torch.optim`` optimiser that goes on where
    ``tree`` stands, one param group for each rule, as :func:`from_torch` reads them.

    ``Momentum`` and ``Nesterov`` without ``eta_outside`` hold ``eta`` in the velocity:
    torch's buffer is it divided by ``eta`` (by ``-eta`` for ``Nesterov``), so the steps
    are the same while ``eta`` stays.

    Args:
        tree: a state tree of ``model`` whose rules have a torch.optim class: see
            :func:`from_torch`; all of one class.
        model: the module it trains.

    Returns:
        A new optimiser over ``model``'s parameters, with copies of the states and
        ``step`` from each Leaf's clock.

    Raises:
        ValueError: a rule has no torch.optim class of its formula or holds a schedule, a
            Leaf is frozen, or the rules are of several classes.

    Example:
        >>> import torch
        >>> from optimisers import Adam, setup
        >>> net = torch.nn.Linear(2, 1)
        >>> tree = setup({"bias": Adam(0.1), "*": Adam(0.01)}, net)
        >>> opt = to_torch(tree, net)
        >>> [(g["lr"], len(g["params"])) for g in opt.param_groups]
        [(0.01, 1), (0.1, 1)]
    """
    groups: list[tuple[Rule, list]] = []  # each rule and its (tensor, Leaf)s
    for kp, leaf in leaves(tree):
        if leaf.frozen or timed(leaf.rule):
            raise ValueError(f"the Leaf at {kp!r} is {'frozen' if leaf.frozen else 'scheduled'}"
                             f", which a torch.optim param group cannot be; thaw_ it, or "
                             f"adjust_ its rule to numbers, first")
        p = getkeypath(model, kp)
        same = next((g for g in groups if g[0] == leaf.rule), None)
        if same is None:
            groups.append(same := (leaf.rule, []))
        if all(q is not p for q, _ in same[1]):  # (a tie: once)
            same[1].append((p, leaf))
    kinds = {_group(rule)[0] for rule, _ in groups}
    if len(kinds) > 1:
        raise ValueError(f"the tree's rules are of the torch.optim classes "
                         f"{sorted(k.__name__ for k in kinds)}; one optimiser has one class")
    (kind,) = kinds or {torch.optim.SGD}
    optimizer = kind([{"params": [p for p, _ in members], **_group(rule)[1]}
                      for rule, members in groups])
    for g, (rule, members) in zip(optimizer.param_groups, groups):
        if _rule(kind, g) != _outside(rule):
            raise ValueError(f"no torch.optim class computes {rule!r}")
        for p, leaf in members:
            saved = optimizer.state[p] = {} if kind is torch.optim.SGD else {
                "step": torch.tensor(float(leaf.clock))}
            chained(rule, leaf.state, lambda r, s, saved=saved: _write(
                _NAMES.get(type(r)), _buffer(r, s), saved))
    return optimizer


def _group(rule: Rule) -> tuple[type, dict]:
    """The torch.optim class and group options that may compute ``rule`` (checked after)."""
    rules = list(rule.rules) if isinstance(rule, OptimiserChain) else [rule]
    decay = rules.pop(0).lambd if len(rules) > 1 and type(rules[0]) is WeightDecay else 0.0
    core, last = rules[0], rules[-1]  # (last: RMSprop's momentum, where it has one)
    g = {"lr": getattr(last, "eta", 0.0), "weight_decay": decay}
    if type(core) in (Adam, AdamW):
        kind = torch.optim.AdamW if type(core) is AdamW else torch.optim.Adam
        return kind, {**g, "betas": core.beta, "eps": core.epsilon, "weight_decay": getattr(
            core, "lambd", decay), "decoupled_weight_decay": type(core) is AdamW}
    if type(core) in (Descent, Momentum, Nesterov):
        return torch.optim.SGD, {**g, "momentum": getattr(core, "rho", 0.0),
                                 "nesterov": type(core) is Nesterov}
    if type(core) is AdaGrad:
        return torch.optim.Adagrad, {**g, "eps": core.epsilon}
    if type(core) is RMSProp:
        momentum = 0.0 if last is core else getattr(last, "rho", 0.0)
        return torch.optim.RMSprop, {**g, "alpha": core.rho, "eps": core.epsilon,
                                     "centered": core.centred, "momentum": momentum}
    raise ValueError(f"no torch.optim class computes {rule!r}")


def _outside(rule: Rule) -> Rule:
    """``rule`` with ``eta_outside=True`` in its momenta: torch.optim's form."""
    if isinstance(rule, OptimiserChain):
        return OptimiserChain(*map(_outside, rule.rules))
    return dataclasses.replace(rule, eta_outside=True) if isinstance(rule, Momentum) else rule


def _buffer(r: Rule, s: Any) -> Any:
    """torch's momentum buffer from the velocity of ``Momentum(eta_outside=False)``."""
    if isinstance(r, Momentum) and not r.eta_outside:
        return s / (-r.eta if isinstance(r, Nesterov) else r.eta)
    return s


def _write(names: Any, s: Any, saved: dict) -> Any:
    """Put a copy of each item of the state ``s`` into ``saved`` under its name."""
    if isinstance(names, tuple):
        return [_write(n, x, saved) for n, x in zip(names, s)]
    if names and s is not None:
        saved[names] = torch.tensor(float(s)) if names == "step" else s.detach().clone()
    return s
