"""``python -m dpbench`` is the ``dpbench`` command (the current folder is not imported from:
dpbench/utils/start_folder.py)."""

from dpbench.utils.start_folder import drop_start_folder

drop_start_folder()

from dpbench.cli import main  # noqa: E402 - after the start folder left sys.path

main()
