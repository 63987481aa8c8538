"""``python -m dpbench.audit`` is the ``dpbench-audit`` command (the current folder is not
imported from: dpbench/utils/start_folder.py)."""

from dpbench.utils.start_folder import drop_start_folder

drop_start_folder()

from dpbench.audit.cli import main  # noqa: E402 - after the start folder left sys.path

main()
