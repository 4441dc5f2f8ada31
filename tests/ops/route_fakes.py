"""Stand-ins and steps shared by the fast-routes tests (test_bn_routes.py, test_ln_routes.py, test_gn_routes.py)."""

import copy

import torch

import normkit
from normkit import aten


class CudaLike(torch.Tensor):
    """A CPU tensor that says it is on CUDA (the routes only note CUDA calls)."""

    @property
    def is_cuda(self):
        return True


def fake_signature(tensors):
    """What ``_plan.signature`` keys (dtype, sizes, strides, device kind per tensor), in Python."""
    return tuple(None if t is None else (t.dtype, tuple(t.shape), t.stride(), t.is_cuda) for t in tensors)


def install(monkeypatch, ops_module, kernels):
    """The routes of ``ops_module`` (a ``normkit.ops`` module) on the stand-ins: the Python signature, ``kernels`` as
    every family's kernel module, CudaLike as a plain tensor, no route noted yet."""
    monkeypatch.setattr(ops_module._plan, "signature", fake_signature)
    monkeypatch.setattr(ops_module, "kernels_for", lambda family, x: kernels)
    monkeypatch.setattr(ops_module, "PLAIN_TENSORS", (torch.Tensor, CudaLike))
    monkeypatch.setattr(ops_module, "_routes", type(ops_module._routes)())


def grad_steps(net, x, grads):
    """Under enable(), one forward of a copy of ``net`` on a fresh leaf copy of x per incoming gradient, and the
    gradients of x and every parameter: (outputs and gradients, aten.call_counts(), aten.routed_counts())."""
    m = copy.deepcopy(net)
    out = []
    aten.reset_counts()
    with normkit.enabled():
        for g in grads:
            xl = x.clone().requires_grad_()
            y = m(xl)
            out += [y, *torch.autograd.grad(y, [xl] + list(m.parameters()), g)]
    return out, aten.call_counts(), aten.routed_counts()
