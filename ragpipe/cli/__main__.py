from ragpipe.cli.app import main

main()
