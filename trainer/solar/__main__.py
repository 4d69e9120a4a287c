from solar.cli import run

run()
