"""The device a process computes on: --device, or the best one this MindSpore package has here,
selected once per process (the engine, `rapidgpt.load_pretrained`, the launcher and the CLI's
generation commands all go through these)."""
import mindspore as ms

from rapidgpt.mindspore_private import device_selected, device_supported

MINDSPORE_DEVICE = {"cpu": "CPU", "gpu": "GPU", "ascend": "Ascend"}


def device_available(device):
    """Whether this MindSpore package can run on `device` here (asked without warnings)."""
    if device == "cpu":
        return True
    return device_supported(MINDSPORE_DEVICE[device])


def select_device(requested):
    """--device, or the best available: ascend, then gpu, then cpu."""
    if requested:
        if not device_available(requested):
            raise ValueError(f"--device {requested}: this MindSpore installation has no "
                             f"{MINDSPORE_DEVICE[requested]} support here; use --device cpu or "
                             f"install MindSpore's {MINDSPORE_DEVICE[requested]} build")
        return requested
    return next(d for d in ("ascend", "gpu", "cpu") if device_available(d))


def ensure_device(device):
    """Select `device` for MindSpore unless a device is already selected (by an earlier engine,
    rapidgpt.load_pretrained or the user): once a kernel has run MindSpore refuses to set it again.
    Kernels run before any selection ran on MindSpore's default, the CPU: then the CPU is kept."""
    if not device_selected():
        try:
            ms.set_device(MINDSPORE_DEVICE[device])
        except RuntimeError:
            if device != "cpu":
                raise


def memory_in_use():
    """--log-memory-to-tensorboard's scalars {name: bytes}. On a GPU or Ascend device Megatron's
    names with MindSpore's device memory pool (reserved, allocated now, allocated at most); on the
    CPU, whose tensors live in the process's memory (MindSpore reports no pool there: all zeros),
    the process's resident memory now and at most."""
    if ms.get_context("device_target") != "CPU":
        return {"mem-reserved-bytes": ms.runtime.memory_reserved(),
                "mem-allocated-bytes": ms.runtime.memory_allocated(),
                "mem-max-allocated-bytes": ms.runtime.max_memory_allocated()}
    import resource

    import psutil
    rss = psutil.Process().memory_info().rss
    # The kernel updates its peak (ru_maxrss, KiB on Linux) lazily: it can lag the current value.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"mem-rss-bytes": rss, "mem-max-rss-bytes": max(rss, peak)}
