"""Continual methods: one file each, one registry line each."""

from pbr.methods.base import ContinualMethod, Context, Options
from pbr.methods.der import DER, DERpp
from pbr.methods.er import ER
from pbr.methods.joint import Joint
from pbr.methods.pbr import PBR
from pbr.methods.sgd import SGD

METHODS: dict[str, type[ContinualMethod]] = {m.name: m for m in (SGD, Joint, ER, DER, DERpp, PBR)}

__all__ = ["METHODS", "ContinualMethod", "Context", "Options"]
