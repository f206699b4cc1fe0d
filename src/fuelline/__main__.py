"""`python -m fuelline`: what torchrun starts (`torchrun --nproc-per-node 8 -m fuelline cache build …`)."""

from fuelline.cli import main

main()
