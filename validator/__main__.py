"""``python -m validate_batch``: the ``validate-batch`` command."""
from .cli.main import main

if __name__ == "__main__":
    main()
