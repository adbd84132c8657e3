"""The optimisation rules, by family, on the base in :mod:`.base`: one array at a time."""

from optimisers.rules.adaptive import (
    ADOPT,
    AdaBelief,
    AdaDelta,
    AdaGrad,
    Adam,
    AdaMax,
    AdamW,
    AMSGrad,
    Lion,
    NAdam,
    OAdam,
    RAdam,
    RMSProp,
    ScheduleFreeAdamW,
)
from optimisers.rules.base import RULES, NewValue, Rule, call, ngrads
from optimisers.rules.composite import EMA, AccumGrad, MixedPrecision, OptimiserChain
from optimisers.rules.descent import (
    ClipGrad,
    ClipNorm,
    Descent,
    Momentum,
    Nesterov,
    Rprop,
    SignDecay,
    WeightDecay,
)
from optimisers.rules.layerwise import LAMB, LARS, Adafactor, Muon
from optimisers.rules.lowprecision import LowPrecision, Quantised, StochasticRounding
from optimisers.rules.tree import ClipGlobalNorm, SkipNonFinite, TreeRule

__all__ = ["Rule", "Descent", "Momentum", "Nesterov", "RMSProp", "Rprop", "Adam", "RAdam",
           "AdaMax", "OAdam", "AdaGrad", "AdaDelta", "AMSGrad", "NAdam", "AdamW", "AdaBelief",
           "Lion", "WeightDecay", "SignDecay", "ClipGrad", "ClipNorm", "OptimiserChain",
           "AccumGrad", "MixedPrecision", "LowPrecision", "Quantised", "StochasticRounding", "EMA",
           "NewValue", "RULES", "call", "ngrads", "TreeRule", "ClipGlobalNorm", "SkipNonFinite",
           "ADOPT", "LAMB", "LARS", "ScheduleFreeAdamW", "Muon", "Adafactor"]
