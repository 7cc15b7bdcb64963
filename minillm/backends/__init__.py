"""Backends behind one forward interface, and the table of what each can run: torch (the model itself), numba
(the forward as one compiled call on minillm.kernels' CPU twins) and cuda (the kernels' CUDA launches)."""
