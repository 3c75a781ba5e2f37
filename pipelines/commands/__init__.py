"""One module per ``cifar10-kfp`` subcommand.

Each module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``,
and keeps heavy imports (torch, kfp) inside ``run`` so ``cifar10-kfp --help`` stays fast.
"""
