from threewalls.runner.run import main

main()
