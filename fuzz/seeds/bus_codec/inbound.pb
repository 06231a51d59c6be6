
s"hi