from dpbench.audit.mia.cli import main

main()
