"""Only what pyproject.toml cannot say: ship the repository's top-level ``profiles/``
folder inside the package, as ``pardec_cli/profile_data/*.toml``.

Everything else (metadata, dependencies, package data) is in pyproject.toml. The task
profiles live at the top of the repository so that they are easy to find and edit;
`pardec_cli.profiles` reads them from there in a source checkout and from the package
data in an installed wheel.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["pardec_cli", "pardec_cli.*"]), "pardec_cli.profile_data"],
    package_dir={"pardec_cli.profile_data": "profiles"},
)
