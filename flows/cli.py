def main():
    import tuneline.core, tuneline.tasks
    print("ok", tuneline.core.__file__)
