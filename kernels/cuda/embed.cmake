# Embeds a kernel source file into a C header as a string constant:
#   cmake -DIN=copy.cu -DOUT=copy_cu_src.h -DNAME=tport_copy_cu_src -P embed.cmake
file(READ "${IN}" content)
string(REPLACE "\\" "\\\\" content "${content}")
string(REPLACE "\"" "\\\"" content "${content}")
string(REPLACE "\n" "\\n\"\n\"" content "${content}")
file(WRITE "${OUT}" "/* generated from ${IN} by kernels/cuda/embed.cmake: do not edit */\n"
                    "static const char ${NAME}[] =\n\"${content}\";\n")
