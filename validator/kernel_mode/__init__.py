"""Kernel mode: ask the real FlashMLA kernels (on a GPU, in a child process) and diff them with the model.

Nothing here imports torch in the calling process. Each kernel call runs in a fresh child
(``python -m validate_batch.kernel_mode.worker``) with a timeout, because the library under test calls
``exit(1)`` or crashes the whole process on exactly the inputs the validator asks about.

Modules:

* :mod:`.builds` - which FlashMLA build an installed package is, by name, from its metadata;
* :mod:`.providers` - which FlashMLA provider can run (``flash_mla``: upstream or sgl-flash-mla; the
  copy inside ``sgl_kernel``), which of its two APIs it exposes, and its build;
* :mod:`.env` - what kernel mode would find here (``validate-batch env``);
* :mod:`.runner` / :mod:`.outcome` - run one job in a child process and classify how it ended (its
  error lines read by the shared recogniser table, :mod:`validate_batch.ingest.recognisers`);
* :mod:`.protocol` - the marker lines a child prints and the exceptions a backend raises;
* :mod:`.worker` / :mod:`.torch_backend` - the child side (torch is imported there only);
* :mod:`.check` - run every call of a report on the GPU and compare with the model;
* :mod:`.probe` - find a limit on hardware by bisection, one child per probe;
* :mod:`.slots` - index a slot-indexed buffer out of bounds on the GPU and report how it fails.

Kernel mode: the real kernels of a build, run in child processes and diffed with the model
(``kernel-check``, probes at limits, slot-buffer probes), and the CPU reproductions with real PyTorch
tensors. May import every room but ``cli``; torch and the kernel libraries only in the child.
"""
