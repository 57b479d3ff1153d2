"""Generated contracts: run `make proto`."""
