# aitune_set_warnings(target): the warning set every aitune target compiles with.
function(aitune_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wno-missing-field-initializers)
endfunction()
