# placeholder; replaced by the fixture generator's make fragment
