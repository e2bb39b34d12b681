"""Fitting routines: each turns data into the parameters of a bayespca model."""
