from dpbench.audit.cli import main

main()
