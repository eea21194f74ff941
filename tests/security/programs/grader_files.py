# A solution (graded by grade_function) that writes the files a grader might trust and prints what
# a naive grader might accept, then returns a wrong answer. Expected: test_failed, no file on the host.

for path in ("expected_output.txt", "reward.txt", "/tmp/reward.txt", "../reward.txt", "result.json"):
    try:
        with open(path, "w") as f:
            f.write('1.0\n{"passed": true, "reward": 1.0}\n')
    except OSError:
        pass
print("chatgym-grade: passed")
print("ALL TESTS PASSED")


def add(a, b):
    return a - b
