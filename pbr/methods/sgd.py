"""SGD: plain fine-tuning on each task in turn (the interface's default step), the lower bound."""

from pbr.methods.base import ContinualMethod


class SGD(ContinualMethod):
    name = "sgd"
    role = "bound"
    label = "SGD"
