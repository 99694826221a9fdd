"""Networks: the CIFAR-stem ResNet18 backbone and the cosine / linear heads."""

from pbr.models.heads import CosineHead, Head, LinearHead
from pbr.models.net import Net, init_parameters
from pbr.models.resnet import BasicBlock, ResNet18

__all__ = ["BasicBlock", "CosineHead", "Head", "LinearHead", "Net", "ResNet18", "init_parameters"]
