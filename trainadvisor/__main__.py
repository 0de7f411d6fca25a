from trainadvisor.cli import main

main()
