from tuner.workers.devices import device_env


def test_physical_ids_set_both_variables_and_drop_rocr() -> None:
    env = device_env({"ROCR_VISIBLE_DEVICES": "0,1,2,3", "PATH": "/bin"}, [1, 3])
    assert env == {"CUDA_VISIBLE_DEVICES": "1,3", "HIP_VISIBLE_DEVICES": "1,3", "PATH": "/bin"}


def test_none_keeps_the_inherited_selection() -> None:
    assert device_env({"CUDA_VISIBLE_DEVICES": "2"}, None) == {"CUDA_VISIBLE_DEVICES": "2"}


def test_inside_ray_ids_are_not_applied_again_but_a_mismatch_is_resolved() -> None:
    ray_env = {"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "5"}
    env = device_env(ray_env, [5], in_ray=True)
    assert env["HIP_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == "0"


def test_input_is_not_mutated() -> None:
    src = {"CUDA_VISIBLE_DEVICES": "0"}
    device_env(src, [1])
    assert src == {"CUDA_VISIBLE_DEVICES": "0"}
