from sdbench.cli import main

main()
