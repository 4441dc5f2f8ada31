"""Every bad input raises torch's exact error type and message (compared with torch where it raises)."""

import re

import pytest
import torch
import torch.nn.functional as F

import normkit.reference as R
from normkit import _checks
from refhelpers import F64, raises_like

A = torch.ops.aten


def _x(*shape, dtype=F64):
    return torch.randn(shape, dtype=torch.float64).to(dtype) if dtype.is_floating_point else torch.ones(
        shape, dtype=dtype)


def _v(n):
    return torch.rand(n, dtype=F64) + 0.5


LONG = torch.ones(2, 3, dtype=torch.long)
x3 = _x(2, 3, 4)

# (id, normkit call, torch call raising the same error) — torch's public entry where raw aten is unchecked.
VS_TORCH = [
    ("bn weight size", lambda: R.native_batch_norm(x3, _v(4), None, None, None, True, 0.1, 1e-5),
     lambda: torch.batch_norm(x3, _v(4), None, None, None, True, 0.1, 1e-5, False)),
    ("bn bias size", lambda: R.native_batch_norm(x3, None, _v(4), None, None, True, 0.1, 1e-5),
     lambda: torch.batch_norm(x3, None, _v(4), None, None, True, 0.1, 1e-5, False)),
    ("bn weight before bias", lambda: R.native_batch_norm(x3, _v(4), _v(5), None, None, True, 0.1, 1e-5),
     lambda: torch.batch_norm(x3, _v(4), _v(5), None, None, True, 0.1, 1e-5, False)),
    ("bn running_mean size", lambda: R.native_batch_norm(x3, _v(4), None, _v(6), _v(7), True, 0.1, 1e-5),
     lambda: torch.batch_norm(x3, _v(4), None, _v(6), _v(7), True, 0.1, 1e-5, False)),
    ("bn running_var size", lambda: R.native_batch_norm(x3, _v(4), None, _v(3), _v(7), False, 0.1, 1e-5),
     lambda: torch.batch_norm(x3, _v(4), None, _v(3), _v(7), False, 0.1, 1e-5, False)),
    ("bn eval no running_mean", lambda: R.native_batch_norm(x3, None, None, None, _v(3), False, 0.1, 1e-5),
     lambda: torch.ops.aten.native_batch_norm(x3, None, None, None, _v(3), False, 0.1, 1e-5)),
    ("bn eval no running_var", lambda: R.native_batch_norm(x3, None, None, _v(3), None, False, 0.1, 1e-5),
     lambda: torch.ops.aten.native_batch_norm(x3, None, None, _v(3), None, False, 0.1, 1e-5)),
    ("bn eval none", lambda: R._batch_norm_no_update(x3, None, None, None, None, 0.1, 1e-5),
     lambda: torch.batch_norm(x3, None, None, None, None, False, 0.1, 1e-5, False)),
    ("bn no_stats eval", lambda: R._native_batch_norm_legit_no_stats(x3, None, None, False, 0.1, 1e-5),
     lambda: torch.batch_norm(x3, None, None, None, None, False, 0.1, 1e-5, False)),
    ("bn one stat (mean)", lambda: R.native_batch_norm(x3, None, None, _v(3), None, True, 0.1, 1e-5),
     lambda: A.native_batch_norm(x3, None, None, _v(3), None, True, 0.1, 1e-5)),
    ("bn one stat (var)", lambda: R.native_batch_norm(x3, None, None, None, _v(3), True, 0.1, 1e-5),
     lambda: A.native_batch_norm(x3, None, None, None, _v(3), True, 0.1, 1e-5)),
    ("bn empty training", lambda: R.native_batch_norm(_x(0, 3, 4), None, None, None, None, True, 0.1, 1e-5),
     lambda: A.native_batch_norm(_x(0, 3, 4), None, None, None, None, True, 0.1, 1e-5)),
    ("bn with_update empty", lambda: R._batch_norm_with_update(_x(0, 3), None, None, _v(3), _v(3), 0.1, 1e-5),
     lambda: A._batch_norm_with_update(_x(0, 3), None, None, _v(3), _v(3), 0.1, 1e-5)),
    ("bn long", lambda: R.native_batch_norm(LONG, None, None, None, None, True, 0.1, 1e-5),
     lambda: A.native_batch_norm(LONG, None, None, None, None, True, 0.1, 1e-5)),
    ("bn complex", lambda: R.native_batch_norm(_x(2, 3, dtype=torch.complex64), None, None, None, None, True,
                                               0.1, 1e-5),
     lambda: A.native_batch_norm(_x(2, 3, dtype=torch.complex64), None, None, None, None, True, 0.1, 1e-5)),
    ("bn bool", lambda: R.native_batch_norm(_x(2, 3, dtype=torch.bool), None, None, _v(3), _v(3), False, 0.1,
                                            1e-5),
     lambda: A.native_batch_norm(_x(2, 3, dtype=torch.bool), None, None, _v(3), _v(3), False, 0.1, 1e-5)),
    ("bn 1-D", lambda: R.native_batch_norm(_x(3), None, None, None, None, True, 0.1, 1e-5),
     lambda: torch.batch_norm(_x(3), None, None, None, None, True, 0.1, 1e-5, False)),
    ("bn 0-D", lambda: R.native_batch_norm(_x(), None, None, None, None, True, 0.1, 1e-5),
     lambda: _x().size(1)),
    ("bn update_stats empty", lambda: R.batch_norm_update_stats(_x(0, 3), _v(3), _v(3), 0.1),
     lambda: A.batch_norm_update_stats(_x(0, 3), _v(3), _v(3), 0.1)),
    ("bn update_stats long", lambda: R.batch_norm_update_stats(LONG, None, None, 0.1),
     lambda: A.batch_norm_update_stats(LONG, None, None, 0.1)),
    ("bn backward long", lambda: R.native_batch_norm_backward(LONG, LONG, None, None, None, _v(3), _v(3), True,
                                                              1e-5, [True] * 3),
     lambda: A.native_batch_norm_backward(LONG, LONG, None, None, None, _v(3), _v(3), True, 1e-5, [True] * 3)),
    ("bn backward grad dtype", lambda: R.native_batch_norm_backward(_x(2, 3), _x(2, 3, dtype=torch.float32),
                                                                    None, None, None, _v(3), _v(3), True, 1e-5,
                                                                    [True] * 3),
     lambda: A.native_batch_norm_backward(_x(2, 3), _x(2, 3, dtype=torch.float32), None, None, None,
                                          _v(3).float(), _v(3).float(), True, 1e-5, [True] * 3)),
    ("batch_norm_backward weight None",
     lambda: R.batch_norm_backward(_x(2, 3), _x(2, 3), None, None, None, _v(3), _v(3), True, 1e-5, [True] * 3,
                                   torch.empty(0, dtype=torch.uint8)),
     lambda: A.batch_norm_backward(_x(2, 3), _x(2, 3), None, None, None, _v(3), _v(3), True, 1e-5, [True] * 3,
                                   torch.empty(0, dtype=torch.uint8))),
    # layer norm
    ("ln empty shape", lambda: R.native_layer_norm(_x(2, 3), [], None, None, 1e-5),
     lambda: A.native_layer_norm(_x(2, 3), [], None, None, 1e-5)),
    ("ln weight shape", lambda: R.native_layer_norm(_x(2, 4, 5), [4, 5], _v(20), None, 1e-5),
     lambda: A.native_layer_norm(_x(2, 4, 5), [4, 5], _v(20), None, 1e-5)),
    ("ln weight transposed", lambda: R.native_layer_norm(_x(2, 4, 5), [4, 5], _x(5, 4), _v(20), 1e-5),
     lambda: A.native_layer_norm(_x(2, 4, 5), [4, 5], _x(5, 4), _v(20), 1e-5)),
    ("ln bias shape", lambda: R.native_layer_norm(_x(2, 4, 5), [4, 5], None, _v(20), 1e-5),
     lambda: A.native_layer_norm(_x(2, 4, 5), [4, 5], None, _v(20), 1e-5)),
    ("ln input shape", lambda: R.native_layer_norm(_x(2, 3, 4, 5), [4], None, None, 1e-5),
     lambda: A.native_layer_norm(_x(2, 3, 4, 5), [4], None, None, 1e-5)),
    ("ln input too small", lambda: R.native_layer_norm(_x(5), [4, 5], None, None, 1e-5),
     lambda: A.native_layer_norm(_x(5), [4, 5], None, None, 1e-5)),
    ("ln 0-D", lambda: R.native_layer_norm(_x(), [1], None, None, 1e-5),
     lambda: A.native_layer_norm(_x(), [1], None, None, 1e-5)),
    ("ln long", lambda: R.native_layer_norm(LONG, [3], None, None, 1e-5),
     lambda: A.native_layer_norm(LONG, [3], None, None, 1e-5)),
    ("ln long bad shape", lambda: R.native_layer_norm(LONG, [4], None, None, 1e-5),
     lambda: A.native_layer_norm(LONG, [4], None, None, 1e-5)),
    ("ln complex", lambda: R.native_layer_norm(_x(2, 3, dtype=torch.complex64), [3], None, None, 1e-5),
     lambda: A.native_layer_norm(_x(2, 3, dtype=torch.complex64), [3], None, None, 1e-5)),
    ("ln backward long", lambda: R.native_layer_norm_backward(LONG, LONG, [3], _x(2, 1), _x(2, 1), None, None,
                                                              [True, False, False]),
     lambda: A.native_layer_norm_backward(LONG, LONG, [3], _x(2, 1), _x(2, 1), None, None, [True, False, False])),
    # rms norm
    ("rms empty shape", lambda: R.rms_norm(_x(2, 3), [], None, 1e-5), lambda: A.rms_norm(_x(2, 3), [], None, 1e-5)),
    ("rms weight shape", lambda: R._fused_rms_norm(_x(2, 4, 5), [4, 5], _v(20), 1e-5),
     lambda: A.rms_norm(_x(2, 4, 5), [4, 5], _v(20), 1e-5)),
    ("rms input shape", lambda: R._fused_rms_norm(_x(2, 3, 8), [4], None, 1e-5),
     lambda: A.rms_norm(_x(2, 3, 8), [4], None, 1e-5)),
    ("rms long", lambda: R.rms_norm(LONG, [3], None, 1e-5), lambda: A.rms_norm(LONG, [3], None, 1e-5)),
    ("rms bool", lambda: R._fused_rms_norm(_x(2, 3, dtype=torch.bool), [3], None, None),
     lambda: A._fused_rms_norm(_x(2, 3, dtype=torch.bool), [3], None, None)),
    # group norm
    ("gn groups 0", lambda: R.native_group_norm(_x(2, 6, 4, 5), None, None, 2, 6, 20, 0, 1e-5),
     lambda: A.native_group_norm(_x(2, 6, 4, 5), None, None, 2, 6, 20, 0, 1e-5)),
    ("gn groups -1", lambda: R.native_group_norm(_x(2, 6, 4, 5), None, None, 2, 6, 20, -1, 1e-5),
     lambda: A.native_group_norm(_x(2, 6, 4, 5), None, None, 2, 6, 20, -1, 1e-5)),
    ("gn divisible", lambda: R.native_group_norm(_x(2, 6, 4, 5), None, None, 2, 6, 20, 4, 1e-5),
     lambda: A.native_group_norm(_x(2, 6, 4, 5), None, None, 2, 6, 20, 4, 1e-5)),
    ("gn weight", lambda: R.native_group_norm(_x(2, 6, 4, 5), _v(5), None, 2, 6, 20, 3, 1e-5),
     lambda: A.native_group_norm(_x(2, 6, 4, 5), _v(5), None, 2, 6, 20, 3, 1e-5)),
    ("gn weight 2-D", lambda: R.native_group_norm(_x(2, 6, 4, 5), _x(6, 1), None, 2, 6, 20, 3, 1e-5),
     lambda: A.native_group_norm(_x(2, 6, 4, 5), _x(6, 1), None, 2, 6, 20, 3, 1e-5)),
    ("gn bias prints weight shape", lambda: R.native_group_norm(_x(2, 6, 4, 5), _v(6), _v(5), 2, 6, 20, 3, 1e-5),
     lambda: A.native_group_norm(_x(2, 6, 4, 5), _v(6), _v(5), 2, 6, 20, 3, 1e-5)),
    ("gn bias no weight", lambda: R.native_group_norm(_x(2, 6, 4, 5), None, _v(5), 2, 6, 20, 3, 1e-5),
     lambda: A.native_group_norm(_x(2, 6, 4, 5), None, _v(5), 2, 6, 20, 3, 1e-5)),
    ("gn numel", lambda: R.native_group_norm(_x(2, 6, 4, 5), None, None, 2, 6, 21, 3, 1e-5),
     lambda: A.native_group_norm(_x(2, 6, 4, 5), None, None, 2, 6, 21, 3, 1e-5)),
    ("gn long", lambda: R.native_group_norm(_x(2, 6, 4, dtype=torch.long), None, None, 2, 6, 4, 3, 1e-5),
     lambda: A.native_group_norm(_x(2, 6, 4, dtype=torch.long), None, None, 2, 6, 4, 3, 1e-5)),
    ("gn backward dtype", lambda: R.native_group_norm_backward(_x(2, 6, 4, dtype=torch.float32), _x(2, 6, 4),
                                                               _x(2, 3), _x(2, 3), None, 2, 6, 4, 3, [True] * 3),
     lambda: A.native_group_norm_backward(_x(2, 6, 4, dtype=torch.float32), _x(2, 6, 4), _x(2, 3), _x(2, 3),
                                          None, 2, 6, 4, 3, [True] * 3)),
    ("gn backward grad numel", lambda: R.native_group_norm_backward(_x(1, 6, 4), _x(2, 6, 4), _x(2, 3), _x(2, 3),
                                                                    _v(6), 2, 6, 4, 3, [True] * 3),
     lambda: A.native_group_norm_backward(_x(1, 6, 4), _x(2, 6, 4), _x(2, 3), _x(2, 3), _v(6), 2, 6, 4, 3,
                                          [True] * 3)),
    ("gn backward mean numel", lambda: R.native_group_norm_backward(_x(2, 6, 4), _x(2, 6, 4), _x(1, 3), _x(2, 3),
                                                                    _v(6), 2, 6, 4, 3, [True] * 3),
     lambda: A.native_group_norm_backward(_x(2, 6, 4), _x(2, 6, 4), _x(1, 3), _x(2, 3), _v(6), 2, 6, 4, 3,
                                          [True] * 3)),
    ("gn backward weight numel", lambda: R.native_group_norm_backward(_x(2, 6, 4), _x(2, 6, 4), _x(2, 3), _x(2, 3),
                                                                      _v(5), 2, 6, 4, 3, [True] * 3),
     lambda: A.native_group_norm_backward(_x(2, 6, 4), _x(2, 6, 4), _x(2, 3), _x(2, 3), _v(5), 2, 6, 4, 3,
                                          [True] * 3)),
    # instance norm
    ("in 2-D running stats", lambda: R.instance_norm(x3, None, None, _x(3, 1), _x(3, 1), True, 0.1, 1e-5),
     lambda: A.instance_norm(x3, None, None, _x(3, 1), _x(3, 1), True, 0.1, 1e-5, False)),
    ("in 2-D weight eval", lambda: R.instance_norm(x3, _x(1, 3), None, _v(3), _v(3), False, 0.1, 1e-5),
     lambda: A.instance_norm(x3, _x(1, 3), None, _v(3), _v(3), False, 0.1, 1e-5, False)),
    ("in empty long with stats", lambda: R.instance_norm(_x(0, 3, 4, dtype=torch.long), None, None, _v(3), _v(3),
                                                         True, 0.1, 1e-5),
     lambda: A.instance_norm(_x(0, 3, 4, dtype=torch.long), None, None, _v(3), _v(3), True, 0.1, 1e-5, False)),
    ("in no stats eval", lambda: R.instance_norm(x3, None, None, None, None, False, 0.1, 1e-5),
     lambda: A.instance_norm(x3, None, None, None, None, False, 0.1, 1e-5, False)),
    ("in one stat eval", lambda: R.instance_norm(x3, None, None, _v(3), None, False, 0.1, 1e-5),
     lambda: A.instance_norm(x3, None, None, _v(3), None, False, 0.1, 1e-5, False)),
    ("in weight size", lambda: R.instance_norm(x3, _v(4), None, None, None, True, 0.1, 1e-5),
     lambda: A.instance_norm(x3, _v(4), None, None, None, True, 0.1, 1e-5, False)),
    ("in running size", lambda: R.instance_norm(x3, None, None, _v(4), _v(4), True, 0.1, 1e-5),
     lambda: A.instance_norm(x3, None, None, _v(4), _v(4), True, 0.1, 1e-5, False)),
    ("in one stat", lambda: R.instance_norm(x3, None, None, _v(3), None, True, 0.1, 1e-5),
     lambda: A.instance_norm(x3, None, None, _v(3), None, True, 0.1, 1e-5, False)),
    ("in long", lambda: R.instance_norm(_x(2, 3, 4, dtype=torch.long), None, None, None, None, True, 0.1, 1e-5),
     lambda: A.instance_norm(_x(2, 3, 4, dtype=torch.long), None, None, None, None, True, 0.1, 1e-5, False)),
    # functional level
    ("F batch size", lambda: _checks.verify_batch_size(_x(1, 3).size()),
     lambda: F.batch_norm(_x(1, 3), None, None, training=True)),
    ("F batch size 3d", lambda: _checks.verify_batch_size(_x(1, 3, 1).size()),
     lambda: F.batch_norm(_x(1, 3, 1), None, None, training=True)),
    ("F eps 0 train", lambda: _checks.check_batch_norm_eps(0.0, True),
     lambda: F.batch_norm(_x(2, 3), None, None, training=True, eps=0.0)),
    ("F eps int 0 train", lambda: _checks.check_batch_norm_eps(0, True),
     lambda: F.batch_norm(_x(2, 3), None, None, training=True, eps=0)),
    ("F eps negative eval", lambda: _checks.check_batch_norm_eps(-1.0, False),
     lambda: F.batch_norm(_x(2, 3), _v(3), _v(3), training=False, eps=-1.0)),
    ("F full order: batch size before eps",
     lambda: _checks.check_batch_norm_functional(_x(1, 3), None, None, _v(4), None, True, 0.0),
     lambda: F.batch_norm(_x(1, 3), None, None, _v(4), None, training=True, eps=0.0)),
    ("F full order: eps before sizes",
     lambda: _checks.check_batch_norm_functional(_x(2, 3), None, None, _v(4), None, True, 0.0),
     lambda: F.batch_norm(_x(2, 3), None, None, _v(4), None, training=True, eps=0.0)),
    ("F full order: sizes", lambda: _checks.check_batch_norm_functional(_x(2, 3), _v(3), None, _v(4), None,
                                                                        False, 1e-5),
     lambda: F.batch_norm(_x(2, 3), _v(3), None, _v(4), None, training=False)),
    ("F 1-D", lambda: _checks.check_batch_norm_functional(_x(3), None, None, None, None, True, 1e-5),
     lambda: F.batch_norm(_x(3), None, None, training=True)),
    ("F gn rank", lambda: _checks.check_group_norm_functional(_x(6), 2), lambda: F.group_norm(_x(6), 2)),
    ("F gn zero groups", lambda: _checks.check_group_norm_functional(_x(2, 6), 0), lambda: F.group_norm(_x(2, 6), 0)),
    ("F gn zero float groups", lambda: _checks.check_group_norm_functional(_x(2, 6), 0.0),
     lambda: F.group_norm(_x(2, 6), 0.0)),
    ("F gn batch size", lambda: _checks.check_group_norm_functional(_x(1, 3), 3), lambda: F.group_norm(_x(1, 3), 3)),
    ("F gn batch size 3d", lambda: _checks.check_group_norm_functional(_x(1, 6, 1), 6),
     lambda: F.group_norm(_x(1, 6, 1), 6)),
    ("F in spatial", lambda: _checks.verify_spatial_size(_x(2, 3, 1).size()), lambda: F.instance_norm(_x(2, 3, 1))),
    ("F in spatial 2d", lambda: _checks.verify_spatial_size(_x(2, 3).size()), lambda: F.instance_norm(_x(2, 3))),
]


@pytest.mark.parametrize("case", VS_TORCH, ids=[c[0] for c in VS_TORCH])
def test_error_matches_torch(case):
    _, ours, theirs = case
    raises_like(ours, theirs)


@pytest.mark.parametrize("rejects_zero_in_eval", [False, True], ids=["torch-2.13", "torch-2.11"])
def test_batch_norm_eps_rule_of_either_torch(monkeypatch, rejects_zero_in_eval):
    """F.batch_norm's eps rule changed between torch 2.11 (eps > 0 always) and 2.13 (eps > 0 in training,
    eps >= 0 in eval); normkit asks the installed torch which one holds (tests above: the installed one)."""
    monkeypatch.setattr(_checks, "_REJECTS_EPS_ZERO_IN_EVAL", rejects_zero_in_eval)
    old = "batch_norm eps must be positive, but got {}"
    expected = {  # (eps, training): message, None where accepted
        (0.0, True): old if rejects_zero_in_eval else "batch_norm eps must be positive during training, but got {}",
        (0, True): old if rejects_zero_in_eval else "batch_norm eps must be positive during training, but got {}",
        (0.0, False): old if rejects_zero_in_eval else None,
        (-1.0, False): old if rejects_zero_in_eval else "batch_norm eps must be non-negative, but got {}",
        (1e-5, True): None, (1e-5, False): None,
    }
    for (eps, training), message in expected.items():
        message = None if message is None else message.format(eps)
        assert _checks.batch_norm_eps_error(eps, training) == message, (eps, training)
        if message is None:
            _checks.check_batch_norm_eps(eps, training)
        else:
            with pytest.raises(ValueError, match=re.escape(message)):
                _checks.check_batch_norm_eps(eps, training)


def test_eps_zero_in_eval_as_the_installed_torch():
    try:
        F.batch_norm(_x(2, 3), _v(3), _v(3), training=False, eps=0.0)
    except ValueError as error:
        raises_like(lambda: _checks.check_batch_norm_eps(0.0, False), exc=ValueError, message=str(error))
    else:
        _checks.check_batch_norm_eps(0.0, False)


# Where aten is unchecked (segfaults, out-of-bounds reads, silent garbage): normkit's documented errors.
OWN = [
    ("bn 1-D with stats", lambda: R.native_batch_norm(_x(3), None, None, _v(3), _v(3), True, 0.1, 1e-5),
     IndexError, "Dimension out of range (expected to be in range of [-1, 0], but got 1)"),
    ("bn backward train no saved", lambda: R.native_batch_norm_backward(_x(2, 3), _x(2, 3), None, None, None,
                                                                        None, None, True, 1e-5, [True] * 3),
     RuntimeError, "save_mean must be defined in training mode"),
    ("bn backward eval no running", lambda: R.native_batch_norm_backward(_x(2, 3), _x(2, 3), None, None, None,
                                                                         _v(3), _v(3), False, 1e-5, [True] * 3),
     RuntimeError, "running_mean must be defined in evaluation mode"),
    ("bn backward weight size", lambda: R.native_batch_norm_backward(_x(2, 3), _x(2, 3), _v(4), None, None,
                                                                     _v(3), _v(3), True, 1e-5, [True] * 3),
     RuntimeError, "weight should contain 3 elements not 4"),
    ("bn backward grad shape", lambda: R.native_batch_norm_backward(_x(2, 3, 1), _x(2, 3), None, None, None,
                                                                    _v(3), _v(3), True, 1e-5, [True] * 3),
     RuntimeError, "Expected grad_out to have the same shape as input, but got grad_out of shape [2, 3, 1] "
                   "and input of shape [2, 3]"),
    ("cudnn weight None", lambda: R.cudnn_batch_norm(x3, None, None, None, None, True, 0.1, 1e-5), RuntimeError,
     "Expected a proper Tensor but got None (or an undefined Tensor in C++) for argument #2 'weight'"),
    ("rms weight shape (fused is unchecked on CPU)", lambda: R._fused_rms_norm(_x(2, 4, 5), [4, 5], _v(20), None),
     RuntimeError, "Expected weight to be of same shape as normalized_shape, but got weight of shape [20] and "
                   "normalized_shape = [4, 5]"),
    ("sync mean/invstd dtype", lambda: R.batch_norm_elemt(x3, None, None, _v(3), _v(3).float(), 1e-5),
     RuntimeError, "mean and invstd need to have the same data types"),
    ("sync mean size", lambda: R.batch_norm_elemt(x3, None, None, _v(4), _v(4), 1e-5), RuntimeError,
     "mean should contain 3 elements not 4"),
    ("sync stats long", lambda: R.batch_norm_stats(LONG, 1e-5), NotImplementedError,
     "\"batch_norm_stats\" not implemented for 'Long'"),
    ("F batch size int", lambda: _checks.verify_batch_size(1), ValueError,
     "Expected more than 1 value per channel when training, got input size 1"),
]


@pytest.mark.parametrize("case", OWN, ids=[c[0] for c in OWN])
def test_documented_errors(case):
    _, fn, exc, msg = case
    raises_like(fn, exc=exc, message=msg)


def test_raising_call_leaves_running_stats_untouched():
    bad = [
        lambda rm, rv: R.native_batch_norm(x3, _v(4), None, rm, rv, True, 0.1, 1e-5),
        lambda rm, rv: R.native_batch_norm(LONG, None, None, rm, rv, True, 0.1, 1e-5),
        lambda rm, rv: R.native_batch_norm(_x(0, 3, 4), None, None, rm, rv, True, 0.1, 1e-5),
        lambda rm, rv: R._batch_norm_with_update(x3, None, _v(2), rm, rv, 0.1, 1e-5),
        lambda rm, rv: R.batch_norm_update_stats(LONG, rm, rv, 0.1),
        lambda rm, rv: R.instance_norm(x3, _v(2), None, rm, rv, True, 0.1, 1e-5),
        lambda rm, rv: R.batch_norm_gather_stats_with_counts(x3, _x(2, 3), _x(2, 2), rm, rv, 0.1, 1e-5,
                                                             torch.ones(2, dtype=F64)),
    ]
    for fn in bad:
        rm, rv = _v(3), _v(3)
        rm0, rv0 = rm.clone(), rv.clone()
        with pytest.raises(Exception):
            fn(rm, rv)
        assert torch.equal(rm, rm0) and torch.equal(rv, rv0)


def test_checks_read_no_data():
    # Meta tensors have no data: every check (and the reference's validation path) must still work.
    m = torch.empty(2, 3, 4, device="meta", dtype=F64)
    _checks.check_batch_norm(m, None, None, None, None, True)
    _checks.check_layer_norm(m, [4], None, None)
    _checks.check_group_norm(m, None, None, 2, 3, 4, 3)
    with pytest.raises(RuntimeError, match="weight should contain 3 elements not 4"):
        _checks.check_batch_norm(m, torch.empty(4, device="meta"), None, None, None, True)
    out, mean, invstd = R.native_batch_norm(m, None, None, None, None, True, 0.1, 1e-5)
    assert out.shape == (2, 3, 4) and mean.shape == (3,) and out.device.type == "meta"


def test_functional_empty_input_skips_checks():
    # torch.batch_norm returns early on empty input, even with wrong-size params or no stats in eval.
    assert _checks.check_batch_norm_functional(_x(0, 3), None, None, _v(4), None, False, 1e-5) is False
    F.batch_norm(_x(0, 3), None, None, _v(4), None, training=False)
    assert _checks.check_batch_norm_functional(_x(2, 3), None, None, None, None, True, 1e-5) is True


def test_dtype_names():
    assert _checks.dtype_name(torch.bfloat16) == "BFloat16"
    assert _checks.dtype_name(torch.complex128) == "ComplexDouble"
    assert _checks.dtype_name(torch.uint8) == "Byte"
