"""normkit.nn.SyncBatchNorm / normkit.distributed.sync_batch_norm over a real process group: three ranks over
gloo (spawned processes; CPU tensors, or CUDA tensors on one GPU), or over NCCL with a GPU a rank (two or three,
where the machine has them), each with its slice of one batch (one slice empty), against torch's float64 batch norm
of the whole batch on the CPU: outputs, input gradients, the ranks' summed weight / bias gradients, and running
statistics over two training steps; eval mode without collectives."""

import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import normkit
from normkit.nn import SyncBatchNorm

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="needs torch.distributed with gloo")

WORLD = 3
F64 = torch.float64
# (name, per-rank batch sizes, trailing dims, input dtype, channels_last, affine, momentum)
CASES = [
    ("nhwc_fp32", (3, 0, 2), (4, 3, 5), torch.float32, True, True, 0.1),
    ("nc_fp32_cma", (2, 2, 1), (6,), torch.float32, False, False, None),
    ("ncdhw_bf16", (1, 2, 1), (3, 2, 3, 4), torch.bfloat16, False, True, 0.3),
    ("ncl_fp64", (2, 1, 3), (5, 7), torch.float64, False, True, 0.5),
]
STEPS = 2


def _for_world(case, world):
    """The case with the first ``world`` ranks' batch sizes (fewer ranks where fewer GPUs take part)."""
    name, sizes, *rest = case
    return (name, sizes[:world], *rest)


def _case_inputs(case, seed):
    """Every step's whole batch (x, dy) in float64, values with an offset; the same on every rank."""
    name, sizes, dims, *_ = case
    g = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    return [(torch.randn((n, *dims), generator=g, dtype=F64) * 2 + 3, torch.randn((n, *dims), generator=g, dtype=F64))
            for _ in range(STEPS)]


def _slice(t, sizes, rank):
    start = sum(sizes[:rank])
    return t[start:start + sizes[rank]]


def _exit_without_teardown():
    """A worker that saved its results and left its process group exits here, without the interpreter's
    teardown: once in CI (2 cores, the whole suite running) a gloo rank aborted at exit with "terminate called
    without an active exception" (a C++ thread destroyed while still joinable), after its work was done. The
    results are in the files the test reads; a failure before this point still raises in the worker."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _layout(t, channels_last):
    if channels_last:
        return t.contiguous(memory_format=torch.channels_last if t.dim() == 4 else torch.channels_last_3d)
    return t


def _worker(rank, path, seed, out_dir, device, world=WORLD):
    backend = "nccl" if device == "nccl" else "gloo"
    if backend == "nccl":  # a GPU a rank
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    dist.init_process_group(backend, init_method=f"file://{path}", rank=rank, world_size=world)
    try:
        results = {}
        for case in CASES:
            case = _for_world(case, world)
            name, sizes, dims, dtype, cl, affine, momentum = case
            torch.manual_seed(seed)  # the same initial parameters on every rank
            m = SyncBatchNorm(dims[0], momentum=momentum, affine=affine)
            if affine:
                with torch.no_grad():
                    m.weight.copy_(torch.rand(dims[0]) + 0.5)
                    m.bias.copy_(torch.randn(dims[0]))
            m.to(device=device, dtype=dtype if dtype == F64 else torch.float32)
            steps = []
            for x, dy in _case_inputs(case, seed):
                xs = _layout(_slice(x, sizes, rank).to(device=device, dtype=dtype), cl).requires_grad_()
                y = m(xs)
                y.backward(_layout(_slice(dy, sizes, rank).to(device=device, dtype=dtype), cl))
                steps.append({"y": y.detach(), "dx": xs.grad, "cl": y.is_contiguous(
                    memory_format=torch.channels_last) if cl else None,
                    "dw": None if not affine or m.weight.grad is None else m.weight.grad.clone(),
                    "db": None if not affine or m.bias.grad is None else m.bias.grad.clone()})
                if affine:
                    m.weight.grad = m.bias.grad = None
            m.eval()
            x_eval = _slice(_case_inputs(case, seed + 1)[0][0], sizes, rank).to(device=device, dtype=dtype)
            results[name] = {"steps": steps, "rm": m.running_mean.clone(), "rv": m.running_var.clone(),
                             "nbt": int(m.num_batches_tracked), "eval": m(x_eval).detach(), "x_eval": x_eval}
        torch.save(_to_cpu(results), os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()
    _exit_without_teardown()


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj


def _gpus():
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.fixture(scope="module", params=[
    "cpu", pytest.param("cuda", marks=pytest.mark.cuda),
    pytest.param("nccl", marks=[pytest.mark.cuda, pytest.mark.skipif(
        _gpus() < 2 or not dist.is_nccl_available(), reason="needs two GPUs and NCCL")])])
def ranks(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("sbn")
    seed = int(os.environ["NORMKIT_RANDOM_SEED"]) % 2 ** 24  # fresh per session, in pytest's header (conftest)
    world = min(WORLD, _gpus()) if request.param == "nccl" else WORLD
    mp.spawn(_worker, args=(str(d / "store"), seed, str(d), request.param, world), nprocs=world, join=True)
    return seed, [torch.load(d / f"{r}.pt") for r in range(world)]


def _tol(dtype):
    return {torch.bfloat16: 2e-2, torch.float32: 2e-5, F64: 1e-10}[dtype]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_sync_batch_norm_matches_the_whole_batch(ranks, case):
    seed, results = ranks
    case = _for_world(case, len(results))
    name, sizes, dims, dtype, cl, affine, momentum = case
    C = dims[0]
    torch.manual_seed(seed)
    w, b = ((torch.rand(C) + 0.5).to(F64), torch.randn(C).to(F64)) if affine else (None, None)  # the ranks' draws
    rm, rv = torch.zeros(C, dtype=F64), torch.ones(C, dtype=F64)
    tol = _tol(dtype)
    for step, (x, dy) in enumerate(_case_inputs(case, seed)):
        x = x.to(dtype).to(F64).requires_grad_()  # the values the ranks saw
        dy = dy.to(dtype).to(F64)
        params = [p.requires_grad_() for p in (w, b) if p is not None]
        factor = momentum if momentum is not None else 1.0 / (step + 1)
        y = F.batch_norm(x, rm, rv, w, b, True, factor, 1e-5)
        grads = torch.autograd.grad(y, [x, *params], dy)
        for r, res in enumerate(results):
            got = res[name]["steps"][step]
            if sizes[r] == 0:
                assert got["y"].shape == (0, *dims) and got["dx"].shape == (0, *dims)
                continue
            torch.testing.assert_close(got["y"].to(F64), _slice(y.detach(), sizes, r), rtol=tol, atol=tol)
            torch.testing.assert_close(got["dx"].to(F64), _slice(grads[0], sizes, r), rtol=tol, atol=tol)
            if cl:
                assert got["cl"], "the output keeps the input's channels_last layout"
        if affine:  # each rank's dw / db are its own batch's (None for an empty one): their sum is the whole batch's
            for i, key in ((1, "dw"), (2, "db")):
                local = [res[name]["steps"][step][key] for res in results]
                assert [t is None for t in local] == [n == 0 for n in sizes]
                total = sum(t.to(F64) for t in local if t is not None)
                torch.testing.assert_close(total, grads[i], rtol=tol, atol=tol * sum(sizes))
        w, b = (w.detach(), b.detach()) if affine else (None, None)
    for res in results:  # every rank holds the same running statistics, the whole batch's
        torch.testing.assert_close(res[name]["rm"].to(F64), rm, rtol=tol, atol=tol)
        torch.testing.assert_close(res[name]["rv"].to(F64), rv, rtol=tol, atol=tol)
        assert res[name]["nbt"] == STEPS
        # eval: each rank alone, with the running statistics
        x_eval = res[name]["x_eval"]
        want = F.batch_norm(x_eval.to(F64), rm, rv, w, b, False, 0.0, 1e-5)
        torch.testing.assert_close(res[name]["eval"].to(F64), want, rtol=tol, atol=tol)


def test_without_a_process_group_it_is_batch_norm():
    torch.manual_seed(0)
    x = torch.randn(6, 4, 5) + 2
    m, ref = SyncBatchNorm(4), torch.nn.BatchNorm1d(4)
    ref.load_state_dict(m.state_dict())
    torch.testing.assert_close(m(x), ref(x))
    torch.testing.assert_close(m.running_var, ref.running_var)
    y = normkit.distributed.sync_batch_norm(x, None, None)
    torch.testing.assert_close(y, F.batch_norm(x, None, None, training=True))


def test_bad_input_raises_before_any_buffer_changes():
    m = SyncBatchNorm(3)
    with pytest.raises(ValueError, match="expected at least 2D input"):
        m(torch.randn(3))
    with pytest.raises(ValueError, match="non-zero"):
        SyncBatchNorm(0)(torch.randn(2, 0, 4))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        m(torch.randn(1, 3))
    assert int(m.num_batches_tracked) == 0


def test_convert_sync_batchnorm_shares_parameters_and_keeps_the_state_dict():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4),
                                torch.nn.Sequential(torch.nn.BatchNorm1d(5, affine=False, momentum=None)))
    model[1].running_mean.add_(1.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    weight = model[1].weight
    out = SyncBatchNorm.convert_sync_batchnorm(model)
    assert type(out[1]) is SyncBatchNorm and type(out[2][0]) is SyncBatchNorm
    assert out[1].weight is weight and out[2][0].momentum is None and not out[2][0].affine
    assert before.keys() == out.state_dict().keys()
    for k, v in out.state_dict().items():
        torch.testing.assert_close(v, before[k])
    # torch's own SyncBatchNorm is swapped by normkit.nn.convert, sharing its tensors
    tsbn = torch.nn.SyncBatchNorm(4)
    swapped = normkit.nn.convert(torch.nn.Sequential(tsbn))[0]
    assert type(swapped) is SyncBatchNorm and swapped.weight is tsbn.weight


# --------------------------------------------------------------------------------------------------------------
# end to end: DDP training with normkit's SyncBatchNorm equals one process training on the whole batch

DDP_WORLD, DDP_LOCAL, DDP_STEPS = 2, 3, 3


def _net():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                               torch.nn.Conv2d(4, 5, 1), torch.nn.BatchNorm2d(5, momentum=None),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(5, 2))


def _ddp_data(seed):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(DDP_WORLD * DDP_LOCAL, 3, 6, 5, generator=g, dtype=F64),
             torch.randn(DDP_WORLD * DDP_LOCAL, 2, generator=g, dtype=F64)) for _ in range(DDP_STEPS)]


def _train(model, batches, opt):
    for x, t in batches:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), t).backward()
        opt.step()


def _ddp_worker(rank, path, seed, out_dir, device):
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=DDP_WORLD)
    try:
        torch.manual_seed(seed)
        model = SyncBatchNorm.convert_sync_batchnorm(_net().double()).to(device)
        local = [(x[rank * DDP_LOCAL:(rank + 1) * DDP_LOCAL].to(device), t[rank * DDP_LOCAL:(rank + 1) * DDP_LOCAL]
                  .to(device)) for x, t in _ddp_data(seed)]
        if device == "cuda":
            ddp = torch.nn.parallel.DistributedDataParallel(model)
            _train(ddp, local, torch.optim.SGD(ddp.parameters(), lr=0.1))
        else:  # DDP refuses SyncBatchNorm (any subclass) in CPU modules: average the gradients as it would
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, t in local:
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), t).backward()
                for p in model.parameters():
                    dist.all_reduce(p.grad)
                    p.grad /= DDP_WORLD
                opt.step()
        torch.save({k: v.cpu() for k, v in model.state_dict().items()}, os.path.join(out_dir, f"ddp{rank}.pt"))
    finally:
        dist.destroy_process_group()
    _exit_without_teardown()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_data_parallel_training_matches_one_process_on_the_whole_batch(device, tmp_path):
    """Data parallelism averages the ranks' gradients of their local mean losses; with equal local batches and
    the batch statistics synchronized, that is the whole batch's gradient: after three SGD steps every parameter
    and running statistic equals one process's training on the whole batch (float64, torch's BatchNorm2d).
    CUDA: DistributedDataParallel itself; CPU: its gradient averaging by hand (it refuses SyncBatchNorm there)."""
    seed = int(os.environ["NORMKIT_RANDOM_SEED"]) % 2 ** 24
    mp.spawn(_ddp_worker, args=(str(tmp_path / "store"), seed, str(tmp_path), device), nprocs=DDP_WORLD, join=True)
    torch.manual_seed(seed)
    ref = _net().double()
    _train(ref, _ddp_data(seed), torch.optim.SGD(ref.parameters(), lr=0.1))
    want = ref.state_dict()
    for r in range(DDP_WORLD):
        got = torch.load(tmp_path / f"ddp{r}.pt")
        assert got.keys() == want.keys()
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-9, atol=1e-12, msg=lambda m: f"rank {r}, {k}: {m}")


def test_convert_sync_batchnorm_takes_the_new_process_group_like_torch():
    # torch makes every _BatchNorm anew, SyncBatchNorm included: re-converting moves it to the given group
    group = object()  # stored only: no collective runs here
    ours = SyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(SyncBatchNorm(4)), process_group=group)
    theirs = torch.nn.SyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(torch.nn.SyncBatchNorm(4)),
                                                           process_group=group)
    assert theirs[0].process_group is group
    assert type(ours[0]) is SyncBatchNorm and ours[0].process_group is group


# --------------------------------------------------------------------------------------------------------------
# edges: a rank outside the module's group, every rank empty, bias without weight, eps 0


def _edge_worker(rank, path, seed, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=WORLD)
    try:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(WORLD * 2, 3, 4, generator=g, dtype=F64) * 2 + 1
        dy = torch.randn(WORLD * 2, 3, 4, generator=g, dtype=F64)
        mine = slice(2 * rank, 2 * rank + 2)
        out = {}
        pair = dist.new_group([0, 1])  # every rank creates it; rank 2 is not in it
        m = SyncBatchNorm(3, affine=False, process_group=pair).double()
        out["pair_y"] = m(x[mine])
        out["pair_rm"] = m.running_mean.clone()
        m = SyncBatchNorm(3, momentum=0.25).double()
        m.running_mean.fill_(0.5)
        y = m(torch.empty(0, 3, 4, dtype=F64, requires_grad=True))
        y.sum().backward()
        out["empty"] = (y.shape, m.running_mean.clone(), m.running_var.clone())
        b = torch.randn(3, generator=g, dtype=F64).requires_grad_()
        xs = x[mine].clone().requires_grad_()
        normkit.distributed.sync_batch_norm(xs, None, None, None, b).backward(dy[mine])
        out["db"] = b.grad.clone()
        b32 = torch.randn(3, generator=g).requires_grad_()  # bf16 input, fp32 bias, no weight
        x16, dy16 = x[mine].bfloat16().requires_grad_(), dy[mine].bfloat16()
        normkit.distributed.sync_batch_norm(x16, None, None, None, b32).backward(dy16)
        out["db_bf16"] = (b32.grad.clone(), dy16)
        w = torch.rand(3, generator=g, dtype=F64).add_(0.5).requires_grad_()
        xs = x[mine].clone().requires_grad_()
        (gx,) = torch.autograd.grad(normkit.distributed.sync_batch_norm(xs, None, None, w), xs, dy[mine],
                                    create_graph=True)
        try:
            torch.autograd.grad(gx.pow(2).sum(), xs)
            out["double_backward"] = "no error"
        except RuntimeError as e:
            out["double_backward"] = str(e)
        m = SyncBatchNorm(3, eps=0.0).double()
        out["eps0"] = m(x[mine]).detach()
        torch.save(out, os.path.join(out_dir, f"edge{rank}.pt"))
    finally:
        dist.destroy_process_group()
    _exit_without_teardown()


def test_sync_edges_like_torchs_module(tmp_path):
    """A rank outside the module's process group normalizes its own batch (torch's module: world size -1 means no
    sync; it used to crash in the gather); a step where every rank is empty decays the running stats by
    (1 - momentum) as aten's gather of no rows does (it turned them NaN); a bias without a weight gets its gradient
    (it got None), summed in fp32 for a bf16 input's fp32 bias (it was rounded to bf16); a second backward raises
    (the all-reduce carries no graph: it was silently wrong); eps = 0 is taken in synchronized training (torch's sync path has F.batch_norm's eps rule
    nowhere)."""
    seed = int(os.environ["NORMKIT_RANDOM_SEED"]) % 2 ** 24
    mp.spawn(_edge_worker, args=(str(tmp_path / "store"), seed, str(tmp_path)), nprocs=WORLD, join=True)
    got = [torch.load(tmp_path / f"edge{r}.pt") for r in range(WORLD)]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(WORLD * 2, 3, 4, generator=g, dtype=F64) * 2 + 1
    dy = torch.randn(WORLD * 2, 3, 4, generator=g, dtype=F64)
    rm = torch.zeros(3, dtype=F64)
    pair_y = F.batch_norm(x[:4], rm, torch.ones(3, dtype=F64), training=True)
    torch.testing.assert_close(torch.cat([got[0]["pair_y"], got[1]["pair_y"]]), pair_y)
    rm2 = torch.zeros(3, dtype=F64)
    torch.testing.assert_close(got[2]["pair_y"], F.batch_norm(x[4:], rm2, torch.ones(3, dtype=F64), training=True))
    torch.testing.assert_close(got[0]["pair_rm"], rm)
    torch.testing.assert_close(got[2]["pair_rm"], rm2)
    eps0 = (x - x.mean((0, 2), keepdim=True)) / x.var((0, 2), unbiased=False, keepdim=True).sqrt()
    for r, res in enumerate(got):
        shape, erm, erv = res["empty"]
        assert shape == (0, 3, 4)
        torch.testing.assert_close(erm, torch.full((3,), 0.5 * 0.75, dtype=F64))
        torch.testing.assert_close(erv, torch.full((3,), 0.75, dtype=F64))
        torch.testing.assert_close(res["db"], dy[2 * r:2 * r + 2].sum((0, 2)))  # local, as the dw / db of torch's
        db32, dy16 = res["db_bf16"]  # summed in fp32, not rounded to the input's bf16
        torch.testing.assert_close(db32.double(), dy16.double().sum((0, 2)), rtol=1e-6, atol=1e-6)
        assert "has no second derivative" in res["double_backward"]  # raises, never a silently wrong second order
        torch.testing.assert_close(res["eps0"], eps0[2 * r:2 * r + 2])
