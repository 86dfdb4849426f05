from fedhet.cli import main

main()
