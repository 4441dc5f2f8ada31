// normkit's native plan replay (normkit/kernels/_native.py builds and loads it).
//
// A launch plan (_plan.py) replayed without Python: check the inputs' alignment, allocate the outputs
// and the scratch buffer, fill each launch's parameters with this call's pointers and scalars, and call
// cuLaunchKernelEx per launch, with the attributes Triton 3.6's own launcher sets (programmatic
// dependent launch, cooperative grid). The parameters are packed as that launcher packs them: one value
// per non-constexpr kernel parameter in its signature type, then the global and profile scratch
// pointers (0: plans hold only kernels that need no scratch memory).
//
// The driver is reached through dlopen / dlsym (no CUDA toolkit at build time; cuda.h is the one Triton
// ships), from the library ``init`` names: libcuda.so.1, or a stand-in in the CPU tests.

#include <Python.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include "cuda.h"

namespace {

typedef CUresult (*LaunchEx)(const CUlaunchConfig*, CUfunction, void**, void**);
typedef CUresult (*CtxGetCurrent)(CUcontext*);
typedef CUresult (*CtxSetCurrent)(CUcontext);
typedef CUresult (*DeviceGet)(CUdevice*, int);
typedef CUresult (*PrimaryCtxRetain)(CUcontext*, CUdevice);
typedef CUresult (*GetErrorString)(CUresult, const char**);

struct Driver {
  LaunchEx launch = nullptr;
  CtxGetCurrent ctx_get = nullptr;
  CtxSetCurrent ctx_set = nullptr;
  DeviceGet device_get = nullptr;
  PrimaryCtxRetain retain = nullptr;
  GetErrorString error_string = nullptr;
} driver;

enum ParamKind : int { kConst = 0, kPointer = 1, kScalarF32 = 2, kScalarF64 = 3 };

struct Param {
  int kind;
  uint64_t bits;  // kConst: the value's bytes (little-endian, zero above its width)
  int slot;       // kPointer: input / allocation slot; kScalar*: scalar slot
  int64_t offset; // kPointer: bytes from that tensor's data pointer
};

struct Step {
  CUfunction function;
  unsigned grid[3];
  unsigned block;
  unsigned shared;
  bool cooperative;
  bool pdl;
  std::vector<Param> params;
};

struct Alloc {
  bool scratch;    // a piece of the one scratch buffer, at ``offset`` bytes
  int64_t offset;
  std::vector<int64_t> shape, stride;
  at::ScalarType dtype;
};

struct Check {
  int slot;
  int64_t offset;
  bool aligned;
};

struct Plan {
  int device;
  Py_ssize_t n_inputs;    // the inputs tuple's length (allocation slots follow)
  size_t n_scalars = 0;   // the scalars tuple's length at least (1 + the largest scalar slot)
  std::vector<Check> checks;
  std::vector<Alloc> allocs;
  int64_t scratch;
  std::vector<Step> steps;
  std::vector<int> outs;  // per output: its slot, -1 for None
};

const char* kCapsule = "normkit.native_plan";

// optional clocks (benchmarks: where a replay's time goes): ns in allocations, launches, the rest; replays
bool timing = false;
int64_t spent_alloc = 0, spent_launch = 0, spent_total = 0, replays = 0;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

PyObject* set_timing(PyObject*, PyObject* arg) {
  int on = PyObject_IsTrue(arg);
  if (on < 0) return nullptr;
  timing = on != 0;
  spent_alloc = spent_launch = spent_total = replays = 0;
  Py_RETURN_NONE;
}

PyObject* timings(PyObject*, PyObject*) {
  return Py_BuildValue("{s:L,s:L,s:L,s:L}", "alloc_ns", (long long)spent_alloc, "launch_ns",
                       (long long)spent_launch, "total_ns", (long long)spent_total, "replays", (long long)replays);
}

void free_plan(PyObject* capsule) {
  delete static_cast<Plan*>(PyCapsule_GetPointer(capsule, kCapsule));
}

template <typename F>
bool resolve(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  if (*out == nullptr) {
    PyErr_Format(PyExc_RuntimeError, "normkit native replay: %s not found in the CUDA driver", name);
    return false;
  }
  return true;
}

PyObject* init(PyObject*, PyObject* arg) {
  const char* path = PyUnicode_AsUTF8(arg);
  if (path == nullptr) return nullptr;
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    PyErr_Format(PyExc_RuntimeError, "normkit native replay: cannot open %s (%s)", path, dlerror());
    return nullptr;
  }
  Driver d;
  if (!resolve(lib, "cuLaunchKernelEx", &d.launch) || !resolve(lib, "cuCtxGetCurrent", &d.ctx_get) ||
      !resolve(lib, "cuCtxSetCurrent", &d.ctx_set) || !resolve(lib, "cuDeviceGet", &d.device_get) ||
      !resolve(lib, "cuDevicePrimaryCtxRetain", &d.retain) || !resolve(lib, "cuGetErrorString", &d.error_string))
    return nullptr;
  driver = d;
  Py_RETURN_NONE;
}

// --- make_plan: the plan's description (built by _plan.py) into a Plan -----------------------------

bool as_int64(PyObject* o, int64_t* out) {
  *out = PyLong_AsLongLong(o);
  return !(*out == -1 && PyErr_Occurred());
}

bool int_list(PyObject* seq, std::vector<int64_t>* out) {
  PyObject* fast = PySequence_Fast(seq, "a sequence of ints");
  if (fast == nullptr) return false;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  for (Py_ssize_t i = 0; i < n; ++i) {
    int64_t v;
    if (!as_int64(PySequence_Fast_GET_ITEM(fast, i), &v)) {
      Py_DECREF(fast);
      return false;
    }
    out->push_back(v);
  }
  Py_DECREF(fast);
  return true;
}

// make_plan(device, n_inputs, checks, allocs, scratch, steps, outs) -> capsule
//   checks: [(slot, offset, aligned)]; allocs: [offset (scratch) | (shape, stride, dtype)];
//   steps: [(function, gx, gy, gz, block, shared, cooperative, pdl, [(kind, a, b)])], a param being
//   (0, bits, 0) a constant, (1, slot, offset) a pointer, (2 | 3, scalar slot, 0) an fp32 / fp64 scalar
PyObject* make_plan(PyObject*, PyObject* args) {
  int device;
  Py_ssize_t n_inputs;
  PyObject *checks, *allocs, *steps, *outs;
  long long scratch;
  if (!PyArg_ParseTuple(args, "inOOLOO", &device, &n_inputs, &checks, &allocs, &scratch, &steps, &outs))
    return nullptr;
  auto plan = new Plan();
  plan->device = device;
  plan->n_inputs = n_inputs;
  plan->scratch = scratch;
  bool ok = true;
  PyObject* fast = nullptr;
  auto fail = [&]() {
    Py_XDECREF(fast);
    delete plan;
    return static_cast<PyObject*>(nullptr);
  };
  fast = PySequence_Fast(checks, "checks");
  if (fast == nullptr) return fail();
  for (Py_ssize_t i = 0; ok && i < PySequence_Fast_GET_SIZE(fast); ++i) {
    int slot, aligned;
    long long off;
    ok = PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "iLp", &slot, &off, &aligned);
    plan->checks.push_back({slot, off, aligned != 0});
  }
  Py_CLEAR(fast);
  if (!ok) return fail();
  fast = PySequence_Fast(allocs, "allocs");
  if (fast == nullptr) return fail();
  for (Py_ssize_t i = 0; ok && i < PySequence_Fast_GET_SIZE(fast); ++i) {
    PyObject* a = PySequence_Fast_GET_ITEM(fast, i);
    Alloc al{};
    if (PyLong_Check(a)) {
      al.scratch = true;
      ok = as_int64(a, &al.offset);
    } else {
      PyObject *shape, *stride, *dtype;
      ok = PyArg_ParseTuple(a, "OOO", &shape, &stride, &dtype) && int_list(shape, &al.shape) &&
           int_list(stride, &al.stride);
      if (ok && !THPDtype_Check(dtype)) {
        PyErr_SetString(PyExc_TypeError, "normkit native replay: an allocation's dtype");
        ok = false;
      }
      if (ok) al.dtype = reinterpret_cast<THPDtype*>(dtype)->scalar_type;
    }
    plan->allocs.push_back(std::move(al));
  }
  Py_CLEAR(fast);
  if (!ok) return fail();
  fast = PySequence_Fast(steps, "steps");
  if (fast == nullptr) return fail();
  for (Py_ssize_t i = 0; ok && i < PySequence_Fast_GET_SIZE(fast); ++i) {
    unsigned long long function;
    unsigned gx, gy, gz, block, shared;
    int coop, pdl;
    PyObject* params;
    ok = PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "KIIIIIppO", &function, &gx, &gy, &gz, &block,
                          &shared, &coop, &pdl, &params);
    if (!ok) break;
    Step st{reinterpret_cast<CUfunction>(function), {gx, gy, gz}, block, shared, coop != 0, pdl != 0, {}};
    PyObject* pf = PySequence_Fast(params, "params");
    if (pf == nullptr) {
      ok = false;
      break;
    }
    for (Py_ssize_t j = 0; ok && j < PySequence_Fast_GET_SIZE(pf); ++j) {
      int kind;
      PyObject *a, *b;
      ok = PyArg_ParseTuple(PySequence_Fast_GET_ITEM(pf, j), "iOO", &kind, &a, &b);
      if (!ok) break;
      Param p{kind, 0, 0, 0};
      if (kind == kConst) {
        p.bits = PyLong_AsUnsignedLongLong(a);
        ok = !PyErr_Occurred();
      } else if (kind == kPointer || kind == kScalarF32 || kind == kScalarF64) {
        int64_t slot;
        ok = as_int64(a, &slot) && as_int64(b, &p.offset);
        p.slot = static_cast<int>(slot);
      } else {
        PyErr_Format(PyExc_ValueError, "normkit native replay: parameter kind %d", kind);
        ok = false;
      }
      st.params.push_back(p);
    }
    Py_DECREF(pf);
    plan->steps.push_back(std::move(st));
  }
  Py_CLEAR(fast);
  if (!ok) return fail();
  fast = PySequence_Fast(outs, "outs");
  if (fast == nullptr) return fail();
  for (Py_ssize_t i = 0; ok && i < PySequence_Fast_GET_SIZE(fast); ++i) {
    int64_t slot;
    ok = as_int64(PySequence_Fast_GET_ITEM(fast, i), &slot);
    plan->outs.push_back(static_cast<int>(slot));
  }
  Py_CLEAR(fast);
  if (!ok) return fail();
  // every slot in range, so that a replay indexes only what it holds (replay checks the tuples' lengths)
  const int64_t n_slots = n_inputs + static_cast<int64_t>(plan->allocs.size());
  auto bad = [&](int64_t slot, int64_t n) { return slot < 0 || slot >= n; };
  for (const Check& c : plan->checks) ok = ok && !bad(c.slot, n_inputs);
  for (const Step& st : plan->steps) {
    for (const Param& p : st.params) {
      if (p.kind == kPointer) ok = ok && !bad(p.slot, n_slots);
      if (p.kind == kScalarF32 || p.kind == kScalarF64) {
        ok = ok && p.slot >= 0;
        plan->n_scalars = std::max(plan->n_scalars, static_cast<size_t>(p.slot) + 1);
      }
    }
  }
  for (int slot : plan->outs) ok = ok && (slot == -1 || !bad(slot, n_slots));
  if (!ok) {
    PyErr_SetString(PyExc_ValueError, "normkit native replay: a slot out of range");
    return fail();
  }
  return PyCapsule_New(plan, kCapsule, free_plan);
}

// --- replay ------------------------------------------------------------------------------------------

bool cuda_check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return true;
  const char* msg = nullptr;
  if (driver.error_string == nullptr || driver.error_string(r, &msg) != CUDA_SUCCESS) msg = "unknown error";
  PyErr_Format(PyExc_RuntimeError, "normkit native replay: %s: CUDA error %d (%s)", what, int(r), msg);
  return false;
}

// This thread's CUDA context: a thread that never used the runtime may have none (Triton's launcher
// makes the primary context current then; so does this, for the plan's device).
bool ensure_context(int device) {
  CUcontext ctx = nullptr;
  if (!cuda_check(driver.ctx_get(&ctx), "cuCtxGetCurrent")) return false;
  if (ctx != nullptr) return true;
  CUdevice dev;
  return cuda_check(driver.device_get(&dev, device), "cuDeviceGet") &&
         cuda_check(driver.retain(&ctx, dev), "cuDevicePrimaryCtxRetain") &&
         cuda_check(driver.ctx_set(ctx), "cuCtxSetCurrent");
}

// replay(plan, inputs, scalars, stream) -> the outputs, or None where the recorded call does not apply
// (an input's 16-byte alignment differs: another binary). inputs: tensors or None, as recorded.
PyObject* replay_untimed(PyObject* const* args, Py_ssize_t nargs);

PyObject* replay(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!timing) return replay_untimed(args, nargs);
  int64_t t0 = now_ns();
  PyObject* out = replay_untimed(args, nargs);
  spent_total += now_ns() - t0;
  ++replays;
  return out;
}

PyObject* replay_untimed(PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "replay(plan, inputs, scalars, stream)");
    return nullptr;
  }
  auto plan = static_cast<Plan*>(PyCapsule_GetPointer(args[0], kCapsule));
  if (plan == nullptr) return nullptr;
  if (driver.launch == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "normkit native replay: init() not called");
    return nullptr;
  }
  PyObject* inputs = args[1];
  PyObject* scalars = args[2];
  if (!PyTuple_Check(inputs) || !PyTuple_Check(scalars)) {
    PyErr_SetString(PyExc_TypeError, "normkit native replay: inputs and scalars must be tuples");
    return nullptr;
  }
  uint64_t stream = PyLong_AsUnsignedLongLong(args[3]);
  if (PyErr_Occurred()) return nullptr;

  const Py_ssize_t n_in = PyTuple_GET_SIZE(inputs);
  if (n_in != plan->n_inputs || static_cast<size_t>(PyTuple_GET_SIZE(scalars)) < plan->n_scalars) {
    PyErr_SetString(PyExc_ValueError, "normkit native replay: inputs or scalars of another length than the plan's");
    return nullptr;
  }
  const size_t n_slots = static_cast<size_t>(n_in) + plan->allocs.size();
  std::vector<uint64_t> ptrs(n_slots, 0);
  std::vector<at::Tensor> made(plan->allocs.size());
  std::optional<at::Device> dev;
  for (Py_ssize_t i = 0; i < n_in; ++i) {
    PyObject* o = PyTuple_GET_ITEM(inputs, i);
    if (o == Py_None) continue;
    if (!THPVariable_Check(o)) {
      PyErr_SetString(PyExc_TypeError, "normkit native replay: inputs must be tensors or None");
      return nullptr;
    }
    const at::Tensor& t = THPVariable_Unpack(o);
    ptrs[i] = reinterpret_cast<uint64_t>(t.data_ptr());
    if (!dev) dev = t.device();
  }
  for (const Check& c : plan->checks) {
    if (((ptrs[c.slot] + c.offset) % 16 == 0) != c.aligned) Py_RETURN_NONE;
  }
  std::vector<double> sc(PyTuple_GET_SIZE(scalars));
  for (size_t i = 0; i < sc.size(); ++i) {
    sc[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(scalars, i));
    if (sc[i] == -1.0 && PyErr_Occurred()) return nullptr;
  }
  if (!dev) {
    PyErr_SetString(PyExc_ValueError, "normkit native replay: no input tensor");
    return nullptr;
  }
  int64_t t_alloc = timing ? now_ns() : 0;
  // torch's errors as torch raises them (an out-of-memory error is torch.OutOfMemoryError, as from the Python
  // replay's torch.empty_strided)
  HANDLE_TH_ERRORS
  uint64_t base = 0;
  at::Tensor scratch;
  if (plan->scratch > 0) {
    scratch = at::empty({plan->scratch}, at::TensorOptions().dtype(at::kByte).device(*dev));
    base = reinterpret_cast<uint64_t>(scratch.data_ptr());
  }
  for (size_t j = 0; j < plan->allocs.size(); ++j) {
    const Alloc& a = plan->allocs[j];
    if (a.scratch) {
      ptrs[n_in + j] = base + a.offset;
    } else {
      made[j] = at::empty_strided(a.shape, a.stride, at::TensorOptions().dtype(a.dtype).device(*dev));
      ptrs[n_in + j] = reinterpret_cast<uint64_t>(made[j].data_ptr());
    }
  }

  int64_t t_launch = timing ? now_ns() : 0;
  if (timing) spent_alloc += t_launch - t_alloc;
  bool ok = ensure_context(plan->device);
  std::vector<uint64_t> values;
  std::vector<void*> params;
  for (size_t s = 0; ok && s < plan->steps.size(); ++s) {
    const Step& st = plan->steps[s];
    if (st.grid[0] == 0 || st.grid[1] == 0 || st.grid[2] == 0) continue;  // (as Triton's launcher)
    const size_t n = st.params.size();
    values.assign(n + 2, 0);  // + the global and profile scratch pointers, 0
    params.assign(n + 3, nullptr);  // + a null end (the CPU tests' stand-in driver reads up to it)
    for (size_t i = 0; i < n; ++i) {
      const Param& p = st.params[i];
      switch (p.kind) {
        case kConst:
          values[i] = p.bits;
          break;
        case kPointer:
          values[i] = ptrs[p.slot] + p.offset;
          break;
        case kScalarF32: {
          float f = static_cast<float>(sc[p.slot]);
          uint32_t u;
          std::memcpy(&u, &f, 4);
          values[i] = u;
          break;
        }
        default:
          std::memcpy(&values[i], &sc[p.slot], 8);
      }
    }
    for (size_t i = 0; i < n + 2; ++i) params[i] = &values[i];
    CUlaunchAttribute attrs[2];
    std::memset(attrs, 0, sizeof(attrs));
    unsigned n_attrs = 0;
    if (st.pdl) {
      attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attrs[n_attrs].value.programmaticStreamSerializationAllowed = 1;
      ++n_attrs;
    }
    if (st.cooperative) {
      attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
      attrs[n_attrs].value.cooperative = 1;
      ++n_attrs;
    }
    CUlaunchConfig config;
    std::memset(&config, 0, sizeof(config));
    config.gridDimX = st.grid[0];
    config.gridDimY = st.grid[1];
    config.gridDimZ = st.grid[2];
    config.blockDimX = st.block;
    config.blockDimY = 1;
    config.blockDimZ = 1;
    config.sharedMemBytes = st.shared;
    config.hStream = reinterpret_cast<CUstream>(stream);
    config.attrs = attrs;
    config.numAttrs = n_attrs;
    ok = cuda_check(driver.launch(&config, st.function, params.data(), nullptr), "cuLaunchKernelEx");
  }
  if (timing) spent_launch += now_ns() - t_launch;
  if (!ok) return nullptr;

  PyObject* out = PyTuple_New(static_cast<Py_ssize_t>(plan->outs.size()));
  if (out == nullptr) return nullptr;
  for (size_t i = 0; i < plan->outs.size(); ++i) {
    int slot = plan->outs[i];
    PyObject* o;
    if (slot < 0) {
      o = Py_None;
      Py_INCREF(o);
    } else if (slot < n_in) {
      o = PyTuple_GET_ITEM(inputs, slot);
      Py_INCREF(o);
    } else {
      o = THPVariable_Wrap(made[slot - n_in]);
      if (o == nullptr) {
        Py_DECREF(out);
        return nullptr;
      }
    }
    PyTuple_SET_ITEM(out, static_cast<Py_ssize_t>(i), o);
  }
  return out;
  END_HANDLE_TH_ERRORS
}

// signature(inputs) -> bytes | None: what a plan is keyed by besides the caller's key (_plan.planned), per input
// its device, dtype, rank, sizes and strides (one 0xFF byte for None); None when one tensor fills two slots (never
// planned) or a tensor is not a plain strided one (sparse, nested: no plan, no fast route)
PyObject* signature(PyObject*, PyObject* inputs) {
  HANDLE_TH_ERRORS
  if (!PyTuple_Check(inputs)) {
    PyErr_SetString(PyExc_TypeError, "normkit native replay: signature() takes a tuple");
    return nullptr;
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(inputs);
  std::string sig;
  sig.reserve(static_cast<size_t>(n) * 80);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* o = PyTuple_GET_ITEM(inputs, i);
    if (o == Py_None) {
      sig.push_back('\xff');
      continue;
    }
    for (Py_ssize_t j = 0; j < i; ++j) {
      if (PyTuple_GET_ITEM(inputs, j) == o) Py_RETURN_NONE;
    }
    if (!THPVariable_Check(o)) {
      PyErr_SetString(PyExc_TypeError, "normkit native replay: inputs must be tensors or None");
      return nullptr;
    }
    const at::Tensor& t = THPVariable_Unpack(o);
    if (t.layout() != c10::kStrided || t.is_nested()) Py_RETURN_NONE;
    const auto sizes = t.sizes();
    const auto strides = t.strides();
    sig.push_back(static_cast<char>(t.device().type()));
    sig.push_back(static_cast<char>(t.device().index()));
    sig.push_back(static_cast<char>(t.scalar_type()));
    sig.push_back(static_cast<char>(sizes.size()));
    sig.append(reinterpret_cast<const char*>(sizes.data()), sizes.size() * sizeof(int64_t));
    sig.append(reinterpret_cast<const char*>(strides.data()), strides.size() * sizeof(int64_t));
  }
  return PyBytes_FromStringAndSize(sig.data(), static_cast<Py_ssize_t>(sig.size()));
  END_HANDLE_TH_ERRORS
}

PyMethodDef methods[] = {
    {"signature", signature, METH_O, "signature(inputs) -> bytes | None: the plan key of the inputs"},
    {"init", init, METH_O, "init(libcuda path): resolve the CUDA driver's entry points"},
    {"make_plan", make_plan, METH_VARARGS, "make_plan(device, checks, allocs, scratch, steps, outs)"},
    {"replay", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(replay)), METH_FASTCALL,
     "replay(plan, inputs, scalars, stream) -> outputs | None"},
    {"set_timing", set_timing, METH_O, "set_timing(on): clock the replays from now on (and zero the clocks)"},
    {"timings", timings, METH_NOARGS, "timings() -> {alloc_ns, launch_ns, total_ns, replays} since set_timing"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_normkit_replay", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__normkit_replay(void) { return PyModule_Create(&module); }
