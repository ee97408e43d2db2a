from pcieprof.cli import main

main()
