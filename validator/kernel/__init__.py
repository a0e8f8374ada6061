"""Kernel mode: ask the real FlashMLA kernels (on a GPU, in a child process) and diff them with the model.

Nothing here imports torch in the calling process. Each kernel call runs in a fresh child
(``python -m validator.kernel.worker``) with a timeout, because the library under test calls
``exit(1)`` or crashes the whole process on exactly the inputs the validator asks about.

Modules:

* :mod:`.builds` - which FlashMLA build an installed package is, by name, from its metadata;
* :mod:`.providers` - which FlashMLA provider can run (``flash_mla``: upstream or sgl-flash-mla; the
  copy inside ``sgl_kernel``), which of its two APIs it exposes, and its build;
* :mod:`.env` - what kernel mode would find here (``validate-batch env``);
* :mod:`.runner` / :mod:`.outcome` - run one job in a child process and classify how it ended (its
  error lines read by the shared recogniser table, :mod:`validator.ingest.recognisers`);
* :mod:`.protocol` - the marker lines a child prints and the exceptions a backend raises;
* :mod:`.worker` / :mod:`.torch_backend` - the child side (torch is imported there only);
* :mod:`.check` - run every call of a report on the GPU and compare with the model;
* :mod:`.probe` - find a limit on hardware by bisection, one child per probe;
* :mod:`.slots` - index a slot-indexed buffer out of bounds on the GPU and report how it fails.
"""
