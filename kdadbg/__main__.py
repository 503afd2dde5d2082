from kdadbg.cli import main

main()
