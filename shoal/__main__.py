from shoal.app.cli import main

main()
