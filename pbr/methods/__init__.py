"""Continual methods: one file each, one registry line each."""

from pbr.methods.agem import AGEM, AGEMR
from pbr.methods.base import Best, ContinualMethod, Context, Options, Setting
from pbr.methods.cbrs import CBRS
from pbr.methods.der import DER, DERpp
from pbr.methods.er import ER
from pbr.methods.ewc import OnlineEWC
from pbr.methods.fdr import FDR
from pbr.methods.gem import GEM
from pbr.methods.gss import GSS
from pbr.methods.hal import HAL
from pbr.methods.icarl import ICaRL
from pbr.methods.joint import Joint
from pbr.methods.lwf import LwF
from pbr.methods.pbr import PBR
from pbr.methods.pnn import PNN
from pbr.methods.podnet import PODNetPlus
from pbr.methods.prs import PRS
from pbr.methods.sgd import SGD
from pbr.methods.si import SI

# In the paper's table order (report rows follow it). Config validation, "auto" values, sweep grids
# and report labels all read this registry.
def registry(classes) -> dict[str, type[ContinualMethod]]:
    """The methods by name. A subclass that kept its parent's `name` (class Mine(ER) without its own)
    would replace the parent here, silently: refused, naming both."""
    out: dict[str, type[ContinualMethod]] = {}
    for m in classes:
        if m.name in out:
            raise TypeError(f"methods {out[m.name].__name__} and {m.__name__} are both named {m.name!r}: give "
                            f"{m.__name__} a name of its own (name = \"...\", docs/architecture.md, adding a method)")
        out[m.name] = m
    return out


METHODS = registry((
    Joint, SGD, OnlineEWC, SI, LwF, PNN, ER, GEM, AGEM, AGEMR, ICaRL, FDR, GSS, HAL, DER, DERpp, PRS, CBRS, PODNetPlus, PBR))


def create(name: str, net, ctx: Context, dataset: str = "cifar10", buffer_size: int = 200, **settings) -> ContinualMethod:
    """The method `name` on `net`, its settings resolved as a run's are ("auto" or left out: the
    method's own value for `dataset` and `buffer_size`)."""
    cls = METHODS[name]
    opts, _ = cls.options(dataset, buffer_size, **settings)
    return cls(net, ctx, opts)


__all__ = ["create", "METHODS", "Best", "ContinualMethod", "Context", "Options", "Setting"]
